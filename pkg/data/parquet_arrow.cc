// The Parquet reader behind `ringleader-prepare parquet`: Apache Arrow's
// C++ Parquet library (the libarrow/libparquet that pyarrow's wheel ships;
// Debian 12 packages no Arrow), wrapped in a small C ABI and built as its
// own shared object, which pkg/data/parquet.c loads with dlopen. So nothing
// else in the project needs C++ or Arrow, and a build or image without it
// still trains; only this mode names what is missing.
//
// One string column of a file, row by row, in batches of BATCH rows read
// with the system allocator (no jemalloc/mimalloc threads in the process)
// and no reader threads. No exception crosses the C ABI: every entry point
// catches, and errors come back as text in the caller's buffer.
#include <arrow/api.h>
#include <arrow/io/file.h>
#include <parquet/arrow/reader.h>
#include <parquet/arrow/schema.h>
#include <parquet/exception.h>

#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <string>

namespace {

constexpr int64_t BATCH = 1024;

struct reader {
    std::unique_ptr<parquet::arrow::FileReader> file;
    std::unique_ptr<arrow::RecordBatchReader> batches;
    std::shared_ptr<arrow::Array> col;  // the current batch's column
    int64_t at = 0;                      // next row within col
    int64_t row = -1;                    // in the file, of the value last returned
    int64_t rows = 0;
};

void say(char *err, size_t n, const std::string &s) {
    if (n) std::snprintf(err, n, "%s", s.c_str());
}

bool stringy(const arrow::DataType &t) {
    return t.id() == arrow::Type::STRING || t.id() == arrow::Type::LARGE_STRING ||
           t.id() == arrow::Type::STRING_VIEW;
}

// 1 with the value, 2 for a null, 0 at the end of the current column
int value_at(reader &r, const char **s, size_t *n) {
    const arrow::Array &a = *r.col;
    int64_t i = r.at++;
    if (a.IsNull(i)) return 2;
    std::string_view v;
    switch (a.type_id()) {
    case arrow::Type::STRING: v = static_cast<const arrow::StringArray &>(a).GetView(i); break;
    case arrow::Type::LARGE_STRING: v = static_cast<const arrow::LargeStringArray &>(a).GetView(i); break;
    case arrow::Type::STRING_VIEW: v = static_cast<const arrow::StringViewArray &>(a).GetView(i); break;
    case arrow::Type::DICTIONARY: {
        const auto &d = static_cast<const arrow::DictionaryArray &>(a);
        int64_t k = d.GetValueIndex(i);
        const arrow::Array &dict = *d.dictionary();
        if (k < 0 || k >= dict.length() || dict.IsNull(k)) return 2;
        switch (dict.type_id()) {
        case arrow::Type::STRING: v = static_cast<const arrow::StringArray &>(dict).GetView(k); break;
        case arrow::Type::LARGE_STRING: v = static_cast<const arrow::LargeStringArray &>(dict).GetView(k); break;
        default: v = static_cast<const arrow::StringViewArray &>(dict).GetView(k); break;
        }
        break;
    }
    default: return 2;  // refused at open
    }
    *s = v.data() ? v.data() : "";
    *n = v.size();
    return 1;
}

}  // namespace

extern "C" {

// The ABI's version: pkg/data/parquet.c refuses a library that answers
// another.
int rlpq_abi(void) { return 1; }

void *rlpq_open(const char *path, const char *column, char *err, size_t errlen) {
    try {
        auto r = std::make_unique<reader>();
        auto in = arrow::io::ReadableFile::Open(path, arrow::default_memory_pool());
        if (!in.ok()) return say(err, errlen, in.status().message()), nullptr;
        parquet::arrow::FileReaderBuilder b;
        arrow::Status st = b.Open(*in);
        if (!st.ok()) return say(err, errlen, st.message()), nullptr;
        parquet::ArrowReaderProperties props(false);  // no reader threads
        props.set_batch_size(BATCH);
        b.memory_pool(arrow::system_memory_pool())->properties(props);
        st = b.Build(&r->file);
        if (!st.ok()) return say(err, errlen, st.message()), nullptr;
        std::shared_ptr<arrow::Schema> schema;
        if (!(st = r->file->GetSchema(&schema)).ok()) return say(err, errlen, st.message()), nullptr;
        int field = schema->GetFieldIndex(column);
        if (field < 0) {
            std::string names;
            for (const auto &f : schema->fields()) names += (names.empty() ? "" : ", ") + f->name();
            if (schema->GetAllFieldIndices(column).size() > 1)
                return say(err, errlen, std::string("more than one column is named \"") + column + "\""), nullptr;
            return say(err, errlen, std::string("no column \"") + column + "\" (columns: " + names + ")"), nullptr;
        }
        const arrow::DataType &t = *schema->field(field)->type();
        bool ok = stringy(t) || (t.id() == arrow::Type::DICTIONARY &&
                                 stringy(*static_cast<const arrow::DictionaryType &>(t).value_type()));
        if (!ok)
            return say(err, errlen, std::string("column \"") + column + "\" is " + t.ToString() + ", not a string"),
                   nullptr;
        // a string field is one leaf column of the file's schema
        int leaf = r->file->manifest().schema_fields[field].column_index;
        if (leaf < 0) return say(err, errlen, std::string("column \"") + column + "\" is nested"), nullptr;
        int groups = r->file->num_row_groups();
        std::vector<int> all(groups);
        for (int g = 0; g < groups; g++) all[g] = g;
        auto br = r->file->GetRecordBatchReader(all, {leaf});
        if (!br.ok()) return say(err, errlen, br.status().message()), nullptr;
        r->batches = std::move(*br);
        r->rows = r->file->parquet_reader()->metadata()->num_rows();
        return r.release();
    } catch (const std::exception &x) {
        say(err, errlen, x.what());
    } catch (...) {
        say(err, errlen, "unknown C++ exception");
    }
    return nullptr;
}

// 1: a value in *s/*n (valid until the next call), 2: a null, 0: the end,
// -1: an error in err
int rlpq_next(void *h, const char **s, size_t *n, char *err, size_t errlen) {
    reader &r = *static_cast<reader *>(h);
    try {
        while (!r.col || r.at >= r.col->length()) {
            std::shared_ptr<arrow::RecordBatch> batch;
            arrow::Status st = r.batches->ReadNext(&batch);
            if (!st.ok()) return say(err, errlen, st.message()), -1;
            if (!batch) return 0;
            if (batch->num_columns() != 1) return say(err, errlen, "a batch without the column"), -1;
            r.col = batch->column(0);
            r.at = 0;
        }
        r.row++;
        return value_at(r, s, n);
    } catch (const std::exception &x) {
        say(err, errlen, x.what());
    } catch (...) {
        say(err, errlen, "unknown C++ exception");
    }
    return -1;
}

long long rlpq_rows(void *h) { return static_cast<reader *>(h)->rows; }
long long rlpq_row(void *h) { return static_cast<reader *>(h)->row; }

void rlpq_close(void *h) {
    try {
        delete static_cast<reader *>(h);
    } catch (...) {
    }
}

}  // extern "C"

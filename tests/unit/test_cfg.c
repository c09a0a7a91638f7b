/* Config descriptors (util/cfg.h): one table gives defaults, the strict
 * reader, the writer and the schema; these tests hold each to the table,
 * and every table of the job config to its own bounds. */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/train.h"
#include "util/cfg.h"

typedef struct inner {
    double ratio;
} inner;
typedef struct demo {
    int count;
    long long big;
    uint64_t seed;
    bool on;
    char mode[8];
    char url[32];
    char owner[16];
    inner in;
} demo;

static const char *const modes[] = {"", "fast", "slow", NULL};
static const rl_cfg_field inner_fields[] = {RL_CFG_FIELD(inner, ratio, .min = 0, .max = 1, .def = 0.5)};
static int inner_check(const void *o, const char *where, rl_err *e) {
    return ((const inner *)o)->ratio == 0.25 ? rl_errf(e, RL_EINPUT, "%s.ratio: not a quarter", where) : RL_OK;
}
static const rl_cfg_section inner_section = RL_CFG_SECTION(inner_fields, .doc = "nested", .check = inner_check);
static const rl_cfg_field demo_fields[] = {
    RL_CFG_FIELD(demo, count, .min = 1, .max = 10, .def = 3, .doc = "how many"),
    RL_CFG_FIELD(demo, big, .min = 0, .max = 1ll << 40, .def = 7),
    RL_CFG_FIELD(demo, seed, .min = 0, .max = 1ll << 53, .def = 1),
    RL_CFG_FIELD(demo, on, .def = 1),
    RL_CFG_FIELD(demo, mode, .choices = modes, .def_str = "fast"),
    RL_CFG_FIELD(demo, url, .flags = RL_CFG_URL),
    RL_CFG_FIELD(demo, owner, .flags = RL_CFG_OPERATOR, .def_str = "op"),
    RL_CFG_FIELD(demo, in, .sub = &inner_section),
};
static const rl_cfg_section demo_section = RL_CFG_SECTION(demo_fields, .doc = "demo");

static int read_text(const char *text, demo *d, rl_err *e) {
    cJSON *o = cJSON_Parse(text);
    cr_assert(o, "%s", text);
    int rc = rl_cfg_read(o, "f.json: demo", &demo_section, d, e);
    cJSON_Delete(o);
    return rc;
}

Test(cfg, the_table_gives_kinds_defaults_and_reads_over_them) {
    cr_expect_eq(demo_fields[0].kind, RL_CFG_INT);
    cr_expect_eq(demo_fields[1].kind, RL_CFG_I64);
    cr_expect_eq(demo_fields[2].kind, RL_CFG_U64);
    cr_expect_eq(demo_fields[3].kind, RL_CFG_BOOL);
    cr_expect_eq(demo_fields[4].kind, RL_CFG_STR);
    cr_expect_eq(demo_fields[4].size, 8);
    cr_expect_eq(demo_fields[7].kind, RL_CFG_OBJ);
    demo d;
    memset(&d, 0x5a, sizeof d);
    rl_cfg_defaults(&demo_section, &d);
    cr_expect(d.count == 3 && d.big == 7 && d.seed == 1 && d.on && !strcmp(d.mode, "fast") && !d.url[0] &&
              !strcmp(d.owner, "op") && d.in.ratio == 0.5);
    rl_err e = {0};
    cr_assert_eq(read_text("{\"count\":10,\"seed\":9007199254740992,\"mode\":\"\",\"in\":{\"ratio\":1}}", &d, &e),
                 0, "%s", e.msg);
    cr_expect(d.count == 10 && d.seed == (1ull << 53) && !d.mode[0] && d.in.ratio == 1 && d.big == 7);
}

Test(cfg, bad_values_name_the_field_in_one_line) {
    static const struct {
        const char *text, *says;
    } bad[] = {
        {"{\"cuont\":1}", "f.json: demo: unknown field \"cuont\""},
        {"{\"count\":1,\"count\":2}", "field \"count\" given twice"},
        {"{\"count\":11}", "f.json: demo.count: 11 is out of range [1, 10]"},
        {"{\"count\":1.5}", "demo.count: must be an integer"},
        {"{\"big\":\"7\"}", "demo.big: must be a number"},
        {"{\"on\":1}", "demo.on: must be true or false"},
        {"{\"mode\":\"warp\"}", "demo.mode: unknown value \"warp\" (\"\", fast or slow)"},
        {"{\"mode\":\"toolongvalue\"}", "demo.mode: longer than 7 characters"},
        {"{\"url\":\"minio:9000\"}", "demo.url: \"minio:9000\" must start with http:// or https://"},
        {"{\"in\":[]}", "f.json: demo.in: must be an object"},
        {"{\"in\":{\"ratio\":2}}", "demo.in.ratio: 2 is out of range [0, 1]"},
        {"{\"in\":{\"ratio\":0.25}}", "demo.in.ratio: not a quarter"},
        {"[]", "f.json: demo: must be a JSON object"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        demo d;
        rl_cfg_defaults(&demo_section, &d);
        rl_err e = {0};
        cr_expect_eq(read_text(bad[i].text, &d, &e), RL_EINPUT, "%s", bad[i].text);
        cr_expect(strstr(e.msg, bad[i].says) && !strchr(e.msg, '\n'), "%s: got \"%s\"", bad[i].text, e.msg);
    }
}

/* What is written reads back the same, integers digit for digit (cJSON
 * alone would print 2^53 with 15 significant digits). */
Test(cfg, write_reads_back_exactly) {
    demo a, b;
    rl_cfg_defaults(&demo_section, &a);
    a.seed = 1ull << 53, a.big = (1ll << 40) - 1, a.on = false, a.in.ratio = 0.1;
    snprintf(a.url, sizeof a.url, "https://x:1");
    cJSON *o = cJSON_CreateObject();
    rl_cfg_write(&demo_section, &a, o);
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    cr_expect(strstr(s, "\"seed\":9007199254740992"), "%s", s);
    rl_cfg_defaults(&demo_section, &b);
    rl_err e = {0};
    cr_assert_eq(read_text(s, &b, &e), 0, "%s: %s", s, e.msg);
    cr_expect(a.count == b.count && a.big == b.big && a.seed == b.seed &&
              a.on == b.on && !strcmp(a.url, b.url) && a.in.ratio == b.in.ratio);
    free(s);
}

Test(cfg, schema_types_bounds_and_leaves_operator_fields_out_of_the_crd) {
    cJSON *crd = rl_cfg_schema(&demo_section, true), *all = rl_cfg_schema(&demo_section, false);
    cr_assert(crd && all);
    const cJSON *p = cJSON_GetObjectItem(crd, "properties");
    cr_expect(!cJSON_GetObjectItem(p, "owner"));
    cr_expect(cJSON_GetObjectItem(cJSON_GetObjectItem(all, "properties"), "owner"));
    const cJSON *seed = cJSON_GetObjectItem(p, "seed"), *mode = cJSON_GetObjectItem(p, "mode");
    cr_expect_str_eq(cJSON_GetObjectItem(seed, "type")->valuestring, "integer");
    cr_expect_str_eq(cJSON_GetObjectItem(seed, "format")->valuestring, "int64");
    char *seed_text = cJSON_PrintUnformatted(seed);
    cr_expect(strstr(seed_text, "\"maximum\":9007199254740992}"), "%s", seed_text);
    free(seed_text);
    cr_expect_eq(cJSON_GetArraySize(cJSON_GetObjectItem(mode, "enum")), 3);
    cr_expect_str_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(p, "count"), "description")->valuestring, "how many");
    cr_expect_str_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(p, "url"), "pattern")->valuestring, "^(https?://.*)?$");
    cr_expect_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(p, "url"), "maxLength")->valuedouble, 31);
    const cJSON *in = cJSON_GetObjectItem(p, "in");
    cr_expect_str_eq(cJSON_GetObjectItem(in, "description")->valuestring, "nested");
    cr_expect(cJSON_GetObjectItem(cJSON_GetObjectItem(in, "properties"), "ratio"));
    char *text = cJSON_PrintUnformatted(crd);
    cr_expect(!strstr(text, "default"), "the CRD carries no defaults: %s", text);
    free(text);
    cJSON_Delete(crd);
    cJSON_Delete(all);
}

/* Every table of the job config: each default inside its own bounds and
 * choices, so the embedded default always passes its own reader. */
static void defaults_in_bounds(const rl_cfg_section *s, const void *obj, const char *where) {
    for (int i = 0; i < s->n; i++) {
        const rl_cfg_field *f = &s->fields[i];
        const char *p = (const char *)obj + f->off;
        double v = f->kind == RL_CFG_INT   ? *(const int *)p
                   : f->kind == RL_CFG_I64 ? (double)*(const long long *)p
                   : f->kind == RL_CFG_U64 ? (double)*(const uint64_t *)p
                   : f->kind == RL_CFG_NUM ? *(const double *)p
                                           : NAN;
        if (!isnan(v)) cr_expect(v >= f->min && v <= f->max, "%s.%s: default %g outside its range", where, f->name, v);
        if (f->kind == RL_CFG_STR && f->choices) {
            const char *const *c = f->choices;
            while (*c && strcmp(*c, p)) c++;
            cr_expect(*c, "%s.%s: default \"%s\" is not one of its choices", where, f->name, p);
        }
        if (f->kind == RL_CFG_OBJ) defaults_in_bounds(f->sub, p, f->name);
    }
}

Test(cfg, every_default_of_the_job_config_is_in_its_own_bounds) {
    rl_job_config c;
    rl_job_config_default(&c);
    defaults_in_bounds(&rl_job_config_section, &c, "job");
    char *s = rl_job_config_to_json(&c);
    rl_job_config back;
    rl_job_config_default(&back);
    rl_err e = {0};
    cr_expect_eq(rl_job_config_parse(s, strlen(s), "default", &back, &e), 0, "%s", e.msg);
    free(s);
}

/* libFuzzer target: the JSON files of a checkpoint -- manifest.json,
 * trainer_state.json, config.json -- read back from storage. The first
 * byte picks the reader. Any input must parse or fail with RL_EINPUT and a
 * one-line message naming the file; a manifest that parses must survive a
 * round trip through the writer unchanged. */
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt.h"

static void one_line(int rc, const rl_err *e, const char *name) {
    if (rc != RL_OK && rc != RL_EINPUT) abort();
    if (rc != RL_OK && (strchr(e->msg, '\n') || strncmp(e->msg, name, strlen(name)) != 0)) abort();
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
    if (size < 1) return 0;
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    rl_err e = {0};
    switch (data[0] % 3) {
    case 0: {
        rl_ckpt_manifest m, m2 = {0};
        int rc = rl_ckpt_manifest_parse(text, len, "manifest.json", &m, &e);
        one_line(rc, &e, "manifest.json");
        if (rc == RL_OK) {
            char *s = rl_ckpt_manifest_json(&m);
            if (!s || rl_ckpt_manifest_parse(s, strlen(s), "rt", &m2, &e) != RL_OK) abort();
            if (m2.step != m.step || m2.nfiles != m.nfiles || strcmp(m2.nonce, m.nonce)) abort();
            for (int i = 0; i < m.nfiles; i++)
                if (strcmp(m.files[i].name, m2.files[i].name) || m.files[i].size != m2.files[i].size ||
                    strcmp(m.files[i].sha256, m2.files[i].sha256))
                    abort();
            free(s);
        }
        rl_ckpt_manifest_free(&m);
        rl_ckpt_manifest_free(&m2);
        break;
    }
    case 1: {
        rl_ckpt_state st;
        int rc = rl_ckpt_state_parse(text, len, "trainer_state.json", &st, &e);
        one_line(rc, &e, "trainer_state.json");
        if (rc == RL_OK && (st.step < 0 || st.world_size < 1)) abort();
        break;
    }
    default: {
        rl_model_config c;
        rl_model_config_default(&c);
        int rc = rl_ckpt_hf_config_check(text, len, "config.json", &c, &e);
        one_line(rc, &e, "config.json");
        break;
    }
    }
    return 0;
}

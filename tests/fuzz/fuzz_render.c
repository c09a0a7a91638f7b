/* libFuzzer target: `ringleader-operator render -f FILE` -- a user's file,
 * YAML or JSON, several documents, typed by YAML's core schema. It must be
 * refused with one line naming the file, or render a List that our own
 * YAML reader reads back. Never a crash. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "k8s/k8s.h"
#include "operator/operator.h"

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size);

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
    char *yaml = NULL;
    rl_err e = {0};
    int rc = rl_op_render((const char *)data, size, "fuzz.yaml", "default", RL_OP_METRICS_NS_DEFAULT, &yaml, &e);
    if (rc == RL_OK) {
        cJSON *back = NULL;
        rl_err pe = {0};
        if (!yaml || rl_k8s_yaml_parse(yaml, strlen(yaml), "rendered", &back, &pe) != RL_OK) abort();
        const cJSON *items = cJSON_GetObjectItemCaseSensitive(back, "items");
        if (!cJSON_IsArray(items) || cJSON_GetArraySize(items) < 7) abort(); /* 6 objects + pods */
        cJSON_Delete(back);
    } else {
        if (yaml || (rc != RL_EINPUT && rc != RL_ENOMEM) || !strstr(e.msg, "fuzz.yaml") || strchr(e.msg, '\n'))
            abort();
    }
    free(yaml);
    return 0;
}

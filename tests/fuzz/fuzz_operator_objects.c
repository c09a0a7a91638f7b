/* libFuzzer target: what the operator reads from the API server -- a
 * TrainingJob (anyone who may create one controls it) and the pods it
 * owns (the kubelet writes their status). Any JSON must either be refused
 * with one line naming a field, or give a job whose owned objects can be
 * built; a pod is always classified into a known state. Never a crash. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "operator/operator.h"

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
    cJSON *o = cJSON_ParseWithLength((const char *)data, size);
    if (!o) return 0;
    rl_pod_info p;
    rl_op_pod_classify(o, &p);
    if ((unsigned)p.state > RL_POD_STATE_LAST || p.index < -1) abort();
    if (!rl_pod_state_name(p.state)[0]) abort();
    rl_op_job j;
    rl_err e = {0};
    int rc = rl_op_job_parse(o, &j, &e);
    if (rc == RL_OK) {
        if (!j.training_json || j.min_nodes < 1 || j.max_nodes < j.min_nodes || j.replicas < j.min_nodes ||
            j.replicas > j.max_nodes || !j.image[0])
            abort();
        cJSON *built[] = {rl_op_service(&j), rl_op_secret(&j, "00"), rl_op_service_account(&j), rl_op_role(&j),
                          rl_op_role_binding(&j), rl_op_pod(&j, j.replicas - 1)};
        for (size_t i = 0; i < sizeof built / sizeof built[0]; i++) {
            if (!built[i]) abort();
            char *s = cJSON_PrintUnformatted(built[i]);
            if (!s) abort();
            cJSON_free(s);
            cJSON_Delete(built[i]);
        }
    } else if ((rc != RL_EINPUT && rc != RL_ENOMEM) || strchr(e.msg, '\n') || !e.msg[0]) {
        abort();
    }
    rl_op_job_free(&j);
    cJSON_Delete(o);
    return 0;
}

/* libFuzzer target: the progress Lease's annotations, which a worker pod
 * writes (ringleader.dev/step, /hung, /stragglers, /degraded, /recovery-*,
 * ...) and the operator mirrors into the TrainingJob's status
 * (rl_op_decide). Any JSON object of annotations gives a plan whose status
 * writes are objects that print, with the worker's text clipped; the
 * status written is read again by the next pass. Not a JSON object: the
 * operator's cache never hands one over, so it is skipped. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "operator/decide.h"

/* The plan's status writes: objects that print, text fields clipped. */
static cJSON *check(const rl_op_plan *p) {
    cJSON *last = NULL;
    for (int i = 0; i < p->n; i++) {
        const rl_op_step *x = &p->steps[i];
        if (x->kind != RL_OP_WRITE) continue;
        if (!cJSON_IsObject(x->status)) abort();
        char *txt = cJSON_PrintUnformatted(x->status);
        if (!txt) abort();
        free(txt);
        const cJSON *slow = cJSON_GetObjectItemCaseSensitive(x->status, "stragglers");
        const cJSON *hang = cJSON_GetObjectItemCaseSensitive(x->status, "lastHang");
        const cJSON *msg = cJSON_GetObjectItemCaseSensitive(hang, "message");
        if ((cJSON_IsString(slow) && strlen(slow->valuestring) > 600) ||
            (cJSON_IsString(msg) && strlen(msg->valuestring) > 2048))
            abort();
        cJSON_Delete(last);
        last = cJSON_Duplicate(x->status, 1);
    }
    return last;
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
    cJSON *ann = cJSON_ParseWithLength((const char *)data, size);
    if (!cJSON_IsObject(ann)) {
        cJSON_Delete(ann);
        return 0;
    }
    rl_op_job j;
    memset(&j, 0, sizeof j);
    strcpy(j.name, "llama");
    strcpy(j.ns, "ml");
    strcpy(j.clean_policy, "None");
    j.replicas = j.min_nodes = j.max_nodes = 2;
    j.restart_limit = 3;
    rl_pod_info pods[2];
    memset(pods, 0, sizeof pods);
    for (int i = 0; i < 2; i++) {
        pods[i].index = i, pods[i].state = RL_POD_RUNNING, pods[i].ready = true;
        pods[i].name[0] = 'p', pods[i].name[1] = (char)('0' + i);
        pods[i].uid[0] = 'u', pods[i].uid[1] = (char)('0' + i);
    }
    cJSON *status = NULL;
    for (int pass = 0; pass < 2; pass++) {
        rl_op_seen s = {.job = &j, .pods = pods, .n = 2, .conflict = "", .progress = ann, .stuck_s = 60,
                        .now = "2026-11-27T12:00:00Z"};
        rl_op_plan p;
        rl_op_decide(&s, status, &p);
        if (p.then_phase) rl_op_decide_phase(&s, 0, "", &p);
        cJSON *next = check(&p);
        rl_op_plan_free(&p);
        if (next) cJSON_Delete(status), status = next;
    }
    cJSON_Delete(status);
    cJSON_Delete(ann);
    return 0;
}

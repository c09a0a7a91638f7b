/* The operator's decisions as a table (decide.h): what one reconcile
 * plans from a job, its pods and its status, with no stand-in and no
 * clock. The same reconciles against a cluster are in test_e2e.c and
 * test_job_status.c. */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "operator/decide.h"

#define NOW "2026-11-26T12:00:00Z"

static rl_op_job a_job(int replicas, int restart_limit, const char *clean) {
    rl_op_job j;
    memset(&j, 0, sizeof j);
    snprintf(j.name, sizeof j.name, "llama");
    snprintf(j.ns, sizeof j.ns, "ml");
    snprintf(j.uid, sizeof j.uid, "u-job");
    snprintf(j.clean_policy, sizeof j.clean_policy, "%s", clean);
    j.replicas = j.min_nodes = j.max_nodes = replicas;
    j.restart_limit = restart_limit;
    return j;
}

static rl_pod_info a_pod(int index, rl_pod_state state, bool ready) {
    rl_pod_info p;
    memset(&p, 0, sizeof p);
    p.index = index;
    p.state = state;
    p.ready = ready;
    snprintf(p.name, sizeof p.name, "llama-%d", index);
    snprintf(p.uid, sizeof p.uid, "u-pod-%d", index);
    snprintf(p.reason, sizeof p.reason, "%s", state == RL_POD_FAILED ? "Error" : "");
    snprintf(p.message, sizeof p.message, "%s", state == RL_POD_FAILED ? "exit 1" : "");
    return p;
}

/* The plan's steps in one line: E(reason) W D(pod) C(index). */
static const char *steps(const rl_op_plan *p) {
    static char out[2048];
    out[0] = '\0';
    for (int i = 0; i < p->n; i++) {
        const rl_op_step *s = &p->steps[i];
        size_t l = strlen(out);
        if (s->kind == RL_OP_EVENT) snprintf(out + l, sizeof out - l, "E(%s) ", s->reason);
        if (s->kind == RL_OP_WRITE) snprintf(out + l, sizeof out - l, "W ");
        if (s->kind == RL_OP_DELETE) snprintf(out + l, sizeof out - l, "D(%s) ", s->pod);
        if (s->kind == RL_OP_CREATE) snprintf(out + l, sizeof out - l, "C(%d) ", s->index);
    }
    return out;
}

static const cJSON *last_write(const rl_op_plan *p) {
    for (int i = p->n - 1; i >= 0; i--)
        if (p->steps[i].kind == RL_OP_WRITE) return p->steps[i].status;
    return NULL;
}

static double num(const cJSON *st, const char *k) {
    return cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(st, k));
}

static const char *condition(const cJSON *st, const char *type, const char *field) {
    const cJSON *cs = cJSON_GetObjectItemCaseSensitive(st, "conditions");
    for (const cJSON *c = cs ? cs->child : NULL; c; c = c->next)
        if (!strcmp(rl_op_jstr(c, "type"), type)) return rl_op_jstr(c, field);
    return "";
}

Test(decide, a_failed_pod_is_counted_before_it_is_deleted_and_only_once) {
    rl_op_job j = a_job(2, 3, "All");
    rl_pod_info pods[] = {a_pod(0, RL_POD_RUNNING, true), a_pod(1, RL_POD_FAILED, false)};
    rl_op_seen s = {.job = &j, .pods = pods, .n = 2, .conflict = "", .stuck_s = 60, .now = NOW};
    rl_op_plan p;
    rl_op_decide(&s, NULL, &p);
    /* no create: the failed pod's name is held until it is gone */
    cr_assert_str_eq(steps(&p), "E(Created) E(PodFailed) W D(llama-1) ", "%s", steps(&p));
    cr_expect(p.then_phase);
    const cJSON *w = p.steps[2].status;
    cr_expect_eq(num(w, "restarts"), 1);
    cr_expect_str_eq(condition(w, "Restarting", "status"), "True");
    cr_expect_str_eq(p.steps[1].msg, "pod llama-1 failed: exit 1 (1 of restartLimit 3)");
    rl_op_decide_phase(&s, 0, "", &p);
    cr_expect_str_eq(rl_op_jstr(last_write(&p), "phase"), "Restarting");
    cr_expect_eq(num(last_write(&p), "readyReplicas"), 1);

    /* the next pass: the pod is going away and already counted */
    cJSON *st = cJSON_Duplicate(last_write(&p), 1);
    rl_op_plan_free(&p);
    pods[1] = a_pod(1, RL_POD_TERMINATING, false);
    rl_op_decide(&s, st, &p);
    cr_expect_str_eq(steps(&p), "", "%s", steps(&p));
    rl_op_decide_phase(&s, 0, "", &p);
    cr_expect_eq(num(last_write(&p), "restarts"), 1);
    rl_op_plan_free(&p);
    cJSON_Delete(st);
}

Test(decide, a_preempted_pod_is_replaced_without_a_restart) {
    rl_op_job j = a_job(1, 0, "All");
    rl_pod_info pods[] = {a_pod(0, RL_POD_PREEMPTED, false)};
    snprintf(pods[0].reason, sizeof pods[0].reason, "Evicted");
    rl_op_seen s = {.job = &j, .pods = pods, .n = 1, .conflict = "", .stuck_s = 60, .now = NOW};
    rl_op_plan p;
    rl_op_decide(&s, NULL, &p);
    cr_assert_str_eq(steps(&p), "E(Created) E(PodPreempted) W D(llama-0) ", "%s", steps(&p));
    cr_expect_eq(num(p.steps[2].status, "preemptions"), 1);
    rl_op_decide_phase(&s, 0, "", &p);
    cr_expect_eq(num(last_write(&p), "restarts"), 0);
    cr_expect_eq(num(last_write(&p), "preemptions"), 1);
    cr_expect_eq(num(last_write(&p), "infrastructureFailures"), 0); /* present from the start */
    rl_op_plan_free(&p);
}

Test(decide, past_the_restart_limit_the_job_fails_then_cleans_up) {
    rl_op_job j = a_job(2, 0, "Running");
    rl_pod_info pods[] = {a_pod(0, RL_POD_RUNNING, true), a_pod(1, RL_POD_FAILED, false)};
    rl_op_seen s = {.job = &j, .pods = pods, .n = 2, .conflict = "", .stuck_s = 60, .now = NOW};
    rl_op_plan p;
    rl_op_decide(&s, NULL, &p);
    /* cleanPodPolicy Running: the failed pod stays for its logs */
    cr_assert_str_eq(steps(&p), "E(Created) E(PodFailed) E(Failed) W D(llama-0) ", "%s", steps(&p));
    cr_expect(!p.then_phase);
    const cJSON *w = last_write(&p);
    cr_expect_str_eq(rl_op_jstr(w, "phase"), "Failed");
    cr_expect_str_eq(rl_op_jstr(w, "completionTime"), NOW);
    cr_expect_str_eq(condition(w, "Failed", "reason"), "RestartLimitExceeded");
    cr_expect(strstr(condition(w, "Failed", "message"), "1 pod failures exceed restartLimit 0; last: pod "
                                                          "llama-1 failed"));
    rl_op_plan_free(&p);
}

Test(decide, a_worker_that_exits_0_completes_the_job_with_its_progress) {
    rl_op_job j = a_job(2, 3, "All");
    rl_pod_info pods[] = {a_pod(0, RL_POD_SUCCEEDED, false), a_pod(1, RL_POD_RUNNING, true)};
    cJSON *ann = cJSON_Parse("{\"ringleader.dev/step\":\"120\",\"ringleader.dev/loss\":\"2.345678\","
                             "\"ringleader.dev/round\":\"x\"}");
    rl_op_seen s = {.job = &j, .pods = pods, .n = 2, .conflict = "", .progress = ann, .stuck_s = 60,
                    .now = NOW};
    rl_op_plan p;
    rl_op_decide(&s, NULL, &p);
    cr_assert_str_eq(steps(&p), "E(Created) E(Succeeded) W D(llama-0) D(llama-1) ", "%s", steps(&p));
    const cJSON *w = last_write(&p);
    cr_expect_str_eq(rl_op_jstr(w, "phase"), "Succeeded");
    cr_expect_eq(num(w, "step"), 120);
    cr_expect_eq(num(w, "loss"), 2.3457);
    cr_expect_null(cJSON_GetObjectItemCaseSensitive(w, "round")); /* garbage is left out */
    rl_op_plan_free(&p);
    cJSON_Delete(ann);
}

Test(decide, suspend_marks_pods_seen_writes_then_deletes) {
    rl_op_job j = a_job(2, 3, "All");
    j.suspend = true;
    rl_pod_info pods[] = {a_pod(0, RL_POD_RUNNING, true), a_pod(1, RL_POD_TERMINATING, false)};
    rl_op_seen s = {.job = &j, .pods = pods, .n = 2, .conflict = "", .stuck_s = 60, .now = NOW};
    rl_op_plan p;
    rl_op_decide(&s, NULL, &p);
    cr_assert_str_eq(steps(&p), "E(Created) E(Suspended) W D(llama-0) W ", "%s", steps(&p));
    const cJSON *w = p.steps[2].status;
    cr_expect_str_eq(rl_op_jstr(w, "phase"), "Suspended");
    cr_expect_eq(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(w, "countedPods")), 2);
    cr_expect_eq(num(last_write(&p), "restarts"), 0);
    cr_expect_eq(num(last_write(&p), "preemptions"), 0);
    rl_op_plan_free(&p);
}

Test(decide, missing_pods_are_created_and_a_refusal_is_retried) {
    rl_op_job j = a_job(3, 3, "All");
    rl_pod_info pods[] = {a_pod(0, RL_POD_RUNNING, true), a_pod(7, RL_POD_RUNNING, true)};
    rl_op_seen s = {.job = &j, .pods = pods, .n = 2, .conflict = "", .stuck_s = 60, .now = NOW};
    rl_op_plan p;
    rl_op_decide(&s, NULL, &p);
    cr_assert_str_eq(steps(&p), "E(Created) E(ScaledDown) D(llama-7) C(1) C(2) ", "%s", steps(&p));
    rl_op_decide_phase(&s, 1, "pod llama-2: exceeded quota", &p);
    cr_expect(strstr(steps(&p), "E(CreatedPods) E(PodCreateFailed) W "), "%s", steps(&p));
    cr_expect_eq(p.requeue_s, 30);
    const cJSON *w = last_write(&p);
    cr_expect_str_eq(rl_op_jstr(w, "phase"), "Pending");
    cr_expect_str_eq(condition(w, "Running", "reason"), "PodCreateFailed");
    rl_op_plan_free(&p);
}

Test(decide, a_conflict_creates_nothing_and_says_why) {
    rl_op_job j = a_job(1, 3, "All");
    rl_op_seen s = {.job = &j, .pods = NULL, .n = 0, .stuck_s = 60, .now = NOW,
                    .conflict = "services llama exists and is not owned by this TrainingJob"};
    rl_op_plan p;
    rl_op_decide(&s, NULL, &p);
    cr_assert_str_eq(steps(&p), "E(Created) ", "%s", steps(&p));
    rl_op_decide_phase(&s, 0, "", &p);
    cr_expect_str_eq(steps(&p), "E(Created) E(ResourceConflict) W ", "%s", steps(&p));
    cr_expect_str_eq(rl_op_jstr(last_write(&p), "phase"), "Pending");
    rl_op_plan_free(&p);
}

Test(decide, an_elastic_job_runs_at_its_minimum_and_a_stuck_pod_is_named) {
    rl_op_job j = a_job(3, 3, "All");
    j.elastic = true, j.min_nodes = 2;
    rl_pod_info pods[] = {a_pod(0, RL_POD_RUNNING, true), a_pod(1, RL_POD_RUNNING, true),
                          a_pod(2, RL_POD_TERMINATING, false)};
    pods[2].overdue_s = 200, pods[2].deleting_s = 260;
    cJSON *st = cJSON_Parse("{\"countedPods\":[\"u-pod-2\"]}"); /* its preemption was counted */
    rl_op_seen s = {.job = &j, .pods = pods, .n = 3, .conflict = "", .stuck_s = 60, .now = NOW};
    rl_op_plan p;
    rl_op_decide(&s, st, &p);
    cr_expect_str_eq(steps(&p), "E(Created) ", "%s", steps(&p));
    rl_op_decide_phase(&s, 0, "", &p);
    cr_expect_str_eq(steps(&p), "E(Created) E(Running) E(PodStuckTerminating) W ", "%s", steps(&p));
    const cJSON *w = last_write(&p);
    cr_expect_str_eq(rl_op_jstr(w, "phase"), "Running");
    cr_expect(strstr(condition(w, "PodStuckTerminating", "message"),
                     "pod llama-2 has been terminating for 4 min (its grace period ended 3 min ago)"));
    rl_op_plan_free(&p);
    cJSON_Delete(st);
}

Test(decide, a_job_that_is_over_only_cleans_up) {
    rl_op_job j = a_job(2, 3, "All");
    rl_pod_info pods[] = {a_pod(0, RL_POD_RUNNING, true), a_pod(1, RL_POD_FAILED, false)};
    cJSON *st = cJSON_Parse("{\"phase\":\"Failed\",\"countedPods\":[\"u-pod-1\",\"u-gone\"]}");
    rl_op_seen s = {.job = &j, .pods = pods, .n = 2, .conflict = "", .stuck_s = 60, .now = NOW};
    rl_op_plan p;
    rl_op_decide(&s, st, &p);
    cr_expect_str_eq(steps(&p), "D(llama-0) D(llama-1) W ", "%s", steps(&p));
    cr_expect(!p.then_phase);
    /* a counted pod that is gone is forgotten; one that is listed stays */
    cr_expect_eq(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(last_write(&p), "countedPods")), 1);
    rl_op_plan_free(&p);
    cJSON_Delete(st);
}

/* An infrastructure failure (the OOM killer, a lost peer, exit 77) is
 * replaced like a preemption and counted apart: never against
 * restartLimit, even at 0. */
Test(decide, an_infrastructure_failure_is_replaced_and_counted_apart) {
    rl_op_job j = a_job(2, 0, "All");
    rl_pod_info pods[] = {a_pod(0, RL_POD_RUNNING, true), a_pod(1, RL_POD_INFRA_FAILED, false)};
    snprintf(pods[1].reason, sizeof pods[1].reason, "OOMKilled");
    snprintf(pods[1].message, sizeof pods[1].message, "container exited with status 137: OOMKilled");
    rl_op_seen s = {.job = &j, .pods = pods, .n = 2, .conflict = "", .stuck_s = 60, .now = NOW};
    rl_op_plan p;
    rl_op_decide(&s, NULL, &p);
    cr_assert_str_eq(steps(&p), "E(Created) E(InfrastructureFailure) W D(llama-1) ", "%s", steps(&p));
    cr_expect(p.steps[1].warning);
    cr_expect_str_eq(p.steps[1].msg, "pod llama-1 ended (OOMKilled: container exited with status 137: OOMKilled): "
                                     "replaced in 10 s, not counted against restartLimit");
    cr_expect_eq(num(p.steps[2].status, "infrastructureFailures"), 1);
    rl_op_decide_phase(&s, 0, "", &p);
    const cJSON *w = last_write(&p);
    cr_expect_str_eq(rl_op_jstr(w, "phase"), "Restarting");
    cr_expect_eq(num(w, "restarts"), 0);
    cr_expect_eq(num(w, "preemptions"), 0);
    cr_expect_eq(num(w, "infrastructureFailures"), 1);

    /* going away, then gone: counted once, then replaced */
    cJSON *st = cJSON_Duplicate(w, 1);
    rl_op_plan_free(&p);
    pods[1] = a_pod(1, RL_POD_TERMINATING, false);
    rl_op_decide(&s, st, &p);
    cr_expect_str_eq(steps(&p), "", "%s", steps(&p));
    rl_op_plan_free(&p);
    s.n = 1;
    rl_op_decide(&s, st, &p); /* the back-off: not before 10 s */
    cr_expect_str_eq(steps(&p), "", "%s", steps(&p));
    cr_expect(p.requeue_s > 9.9 && p.requeue_s < 10.5, "requeue in %.2f s", p.requeue_s);
    rl_op_plan_free(&p);
    s.now = "2026-11-26T12:00:10.2Z";
    rl_op_decide(&s, st, &p);
    cr_expect_str_eq(steps(&p), "C(1) ", "%s", steps(&p));
    rl_op_decide_phase(&s, 1, "", &p);
    cr_expect_eq(num(last_write(&p), "infrastructureFailures"), 1);
    cr_expect_eq(num(last_write(&p), "restarts"), 0);
    rl_op_plan_free(&p);
    cJSON_Delete(st);
}

/* Infrastructure failures in a row back off 10 s, 20 s, 40 s ... 5 min; one
 * more than 10 min after the last starts over. */
static double backoff_after(cJSON *st, const char *now, const char *uid, const char *later) {
    rl_op_job j = a_job(1, 0, "All");
    rl_pod_info pod = a_pod(0, RL_POD_INFRA_FAILED, false);
    snprintf(pod.uid, sizeof pod.uid, "%s", uid);
    rl_op_seen s = {.job = &j, .pods = &pod, .n = 1, .conflict = "", .stuck_s = 60, .now = now};
    rl_op_plan p;
    rl_op_decide(&s, st, &p); /* counted; deleted */
    cJSON *w = cJSON_Duplicate(last_write(&p), 1);
    rl_op_plan_free(&p);
    s.n = 0, s.now = later; /* gone: how long until its replacement? */
    rl_op_decide(&s, w, &p);
    bool created = strstr(steps(&p), "C(0)") != NULL;
    double wait = created ? 0 : p.requeue_s;
    rl_op_plan_free(&p);
    cJSON_DeleteItemFromObject(st, "infrastructureStreak");
    cJSON_DeleteItemFromObject(st, "lastInfrastructureFailureTime");
    cJSON_AddItemToObject(st, "infrastructureStreak", cJSON_Duplicate(cJSON_GetObjectItem(w, "infrastructureStreak"), 1));
    cJSON_AddItemToObject(st, "lastInfrastructureFailureTime",
                          cJSON_Duplicate(cJSON_GetObjectItem(w, "lastInfrastructureFailureTime"), 1));
    cJSON_Delete(w);
    return wait;
}

Test(decide, infrastructure_failures_in_a_row_back_off) {
    cJSON *st = cJSON_CreateObject();
    /* at the failure's own time, the wait left (plus the requeue's 0.1 s) */
    double w = backoff_after(st, "2026-11-26T12:00:00Z", "a", "2026-11-26T12:00:00Z");
    cr_expect_float_eq(w, 10.1, 1e-6);
    w = backoff_after(st, "2026-11-26T12:00:30Z", "b", "2026-11-26T12:00:35Z");
    cr_expect_float_eq(w, 15.1, 1e-6);
    w = backoff_after(st, "2026-11-26T12:01:30Z", "c", "2026-11-26T12:01:30Z");
    cr_expect_float_eq(w, 40.1, 1e-6);
    cr_expect_eq(num(st, "infrastructureStreak"), 3);
    for (int i = 0; i < 6; i++) backoff_after(st, "2026-11-26T12:05:00Z", i % 2 ? "d" : "e", "2026-11-26T12:05:00Z");
    w = backoff_after(st, "2026-11-26T12:06:00Z", "f", "2026-11-26T12:06:00Z");
    cr_expect_float_eq(w, 300.1, 1e-6, "capped at 5 min: %g", w);
    w = backoff_after(st, "2026-11-26T12:06:00Z", "g", "2026-11-26T12:11:01Z");
    cr_expect_eq(w, 0, "waited out: %g", w);
    /* 10 min of quiet: the next one starts over */
    w = backoff_after(st, "2026-11-26T12:16:02Z", "h", "2026-11-26T12:16:02Z");
    cr_expect_float_eq(w, 10.1, 1e-6);
    cr_expect_eq(num(st, "infrastructureStreak"), 1);
    cJSON_Delete(st);
}

/* A user error (exit 2) fails the job at once: no replacement, no restart
 * counted, the pod and the worker's words in the Failed condition. */
Test(decide, a_user_error_fails_the_job_at_once) {
    rl_op_job j = a_job(2, 3, "All");
    rl_pod_info pods[] = {a_pod(0, RL_POD_RUNNING, true), a_pod(1, RL_POD_USER_ERROR, false)};
    snprintf(pods[1].reason, sizeof pods[1].reason, "UserError");
    snprintf(pods[1].message, sizeof pods[1].message,
             "container exited with status 2: Error: UserError: data.train: no file matches /x/none_*.bin");
    cJSON *st0 = cJSON_Parse("{\"restarts\":1}");
    rl_op_seen s = {.job = &j, .pods = pods, .n = 2, .conflict = "", .stuck_s = 60, .now = NOW};
    rl_op_plan p;
    rl_op_decide(&s, st0, &p);
    cr_assert_str_eq(steps(&p), "E(Created) E(UserError) W D(llama-0) D(llama-1) ", "%s", steps(&p));
    cr_expect(!p.then_phase);
    cr_expect(p.steps[1].warning);
    const char *why = "pod llama-1: container exited with status 2: Error: UserError: data.train: no file matches "
                      "/x/none_*.bin";
    cr_expect(strstr(p.steps[1].msg, why), "%s", p.steps[1].msg);
    const cJSON *w = last_write(&p);
    cr_expect_str_eq(rl_op_jstr(w, "phase"), "Failed");
    cr_expect_str_eq(condition(w, "Failed", "reason"), "UserError");
    cr_expect_str_eq(condition(w, "Failed", "message"), why);
    cr_expect_eq(num(w, "restarts"), 1);
    cr_expect_eq(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(w, "countedPods")), 1);

    /* seen again: over, nothing counted twice */
    cJSON *st = cJSON_Duplicate(w, 1);
    rl_op_plan_free(&p);
    rl_op_decide(&s, st, &p);
    cr_expect_str_eq(steps(&p), "D(llama-0) D(llama-1) W ", "%s", steps(&p));
    cr_expect_eq(num(last_write(&p), "restarts"), 1);
    cr_expect_eq(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(last_write(&p), "countedPods")), 1);
    rl_op_plan_free(&p);
    cJSON_Delete(st);
    cJSON_Delete(st0);
}

/* Already counted, yet the job not over (say, a write lost in between):
 * a user error is still never retried, and its uid listed once. The peer
 * that lost it is not counted: the job is over. cleanPodPolicy Running
 * keeps both for their logs. */
Test(decide, a_counted_user_error_is_still_not_retried) {
    rl_op_job j = a_job(2, 3, "Running");
    rl_pod_info pods[] = {a_pod(0, RL_POD_INFRA_FAILED, false), a_pod(1, RL_POD_USER_ERROR, false)};
    snprintf(pods[0].reason, sizeof pods[0].reason, "PeerLost");
    cJSON *st = cJSON_Parse("{\"countedPods\":[\"u-pod-1\"]}");
    rl_op_seen s = {.job = &j, .pods = pods, .n = 2, .conflict = "", .stuck_s = 60, .now = NOW};
    rl_op_plan p;
    rl_op_decide(&s, st, &p);
    cr_assert_str_eq(steps(&p), "E(Created) E(UserError) W ", "%s", steps(&p));
    const cJSON *w = last_write(&p);
    cr_expect_str_eq(rl_op_jstr(w, "phase"), "Failed");
    cr_expect_str_eq(condition(w, "Failed", "reason"), "UserError");
    cr_expect_eq(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(w, "countedPods")), 1);
    cr_expect_null(cJSON_GetObjectItemCaseSensitive(w, "infrastructureFailures"));
    rl_op_plan_free(&p);
    cJSON_Delete(st);
}

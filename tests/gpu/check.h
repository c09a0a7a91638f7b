/* The little check framework of make test-gpu (defined in test_gpu.c),
 * shared with the trainer-level checks of test_gpu_train.c. */
#ifndef RL_TESTS_GPU_CHECK_H
#define RL_TESTS_GPU_CHECK_H

#include "util/util.h"

int selected(const char *name);
/* fresh random inputs per check, from the run's seed and the check's name */
void reseed(const char *name);
void report(const char *name, int ok, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void fail_err(const char *name, const rl_err *e);
/* The trainer-level checks (test_gpu_train.c). */
void test_gpu_train(void);

#endif

/* Many documents encoded on all cores (tok.h): OpenMP hands documents to
 * threads, each with its own encoder; results land in document order. */
#include "tok/tok_internal.h"

#include <omp.h>
#include <stdlib.h>

int rl_bpe_encode_many(rl_bpe_enc *const *encs, int nenc, const char *const *docs, const size_t *lens, size_t n,
                       bool special, rl_bpe_ids *outs, rl_err *e) {
    int *rc = calloc(n ? n : 1, sizeof *rc);
    if (!rc) return rl_errf(e, RL_ENOMEM, "tokenizer: out of memory");
#pragma omp parallel for num_threads(nenc) schedule(dynamic, 1)
    for (size_t i = 0; i < n; i++) {
        outs[i].n = 0;
        rl_err te;
        rc[i] = rl_bpe_encode(encs[omp_get_thread_num()], docs[i], lens[i], special, &outs[i], &te);
    }
    /* the first failure in document order, its message from one more
     * (deterministic) encoding rather than one rl_err per document */
    int r = RL_OK;
    for (size_t i = 0; i < n && !r; i++)
        if (rc[i]) {
            outs[i].n = 0;
            r = rl_bpe_encode(encs[0], docs[i], lens[i], special, &outs[i], e);
            if (!r) r = rl_errf(e, rc[i], "tokenizer: document %zu failed on one thread only", i);
        }
    free(rc);
    return r;
}

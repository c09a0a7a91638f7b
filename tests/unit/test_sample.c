/* Samples (pkg/train/sample.c): what the model says, token by token, is
 * its own argmax at temperature 0, stops at the end-of-text token, slides
 * past the window, and a draw respects top-k. Checked against forwards of
 * the same model run here, not against remembered numbers. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "train/train.h"

static rl_model g_m;
static rl_lm g_lm; /* g_m through the sampler's seam */

static void setup(void) {
    rl_model_config c;
    rl_model_config_default(&c);
    c.hidden_size = 32, c.intermediate_size = 64, c.num_hidden_layers = 2, c.num_attention_heads = 4;
    c.num_key_value_heads = 2, c.vocab_size = 50, c.max_position_embeddings = 16;
    rl_err e = {0};
    cr_assert_eq(rl_model_create(&g_m, &c, 1, 8, &e), 0, "%s", e.msg);
    rl_model_init_params(&c, g_m.params, 7);
    rl_lm_cpu(&g_m, &g_lm);
}
static void teardown(void) { rl_model_destroy(&g_m); }

static int argmax_next(const int32_t *seq, int len) {
    int T = len < g_m.T ? len : g_m.T;
    rl_err e = {0};
    cr_assert_eq(rl_model_forward(&g_m, seq + len - T, NULL, 1, T, NULL, &e), 0, "%s", e.msg);
    const float *l = rl_model_logits(&g_m) + (size_t)(T - 1) * g_m.cfg.vocab_size;
    int best = 0;
    for (int i = 1; i < g_m.cfg.vocab_size; i++)
        if (l[i] > l[best]) best = i;
    return best;
}

Test(sample, greedy_is_the_argmax_of_each_step_and_slides_past_the_window, .init = setup, .fini = teardown) {
    /* 5 prompt tokens + 12 new ones: past the 8-token window, so later
     * steps see only the newest 8 */
    const int32_t prompt[5] = {3, 14, 15, 9, 26};
    rl_sample_opts o = {.max_new_tokens = 12, .eos_id = -1};
    int32_t *out;
    int n;
    rl_err e = {0};
    cr_assert_eq(rl_sample(&g_lm, prompt, 5, &o, &out, &n, &e), 0, "%s", e.msg);
    cr_assert_eq(n, 17);
    cr_assert_eq(memcmp(out, prompt, sizeof prompt), 0, "the prompt leads the output");
    for (int i = 5; i < n; i++) cr_assert_eq(out[i], argmax_next(out, i), "token %d is not the argmax", i);
    free(out);
}

Test(sample, the_end_of_text_token_stops_it_and_is_kept_last, .init = setup, .fini = teardown) {
    const int32_t prompt[2] = {1, 2};
    int want = argmax_next(prompt, 2); /* make the first greedy token the EOS */
    rl_sample_opts o = {.max_new_tokens = 10, .eos_id = want};
    int32_t *out;
    int n;
    rl_err e = {0};
    cr_assert_eq(rl_sample(&g_lm, prompt, 2, &o, &out, &n, &e), 0, "%s", e.msg);
    cr_assert_eq(n, 3, "stopped after the end-of-text token");
    cr_assert_eq(out[2], want);
    free(out);
}

Test(sample, top_k_1_at_any_temperature_is_greedy_and_a_seed_repeats_a_draw, .init = setup, .fini = teardown) {
    const int32_t prompt[3] = {4, 8, 15};
    rl_sample_opts g = {.max_new_tokens = 8, .eos_id = -1}, k1 = g, hot = g;
    k1.temperature = 5, k1.top_k = 1, k1.seed = 99;
    hot.temperature = 50, hot.seed = 5;
    int32_t *a, *b, *c, *d;
    int na, nb, nc, nd;
    rl_err e = {0};
    cr_assert_eq(rl_sample(&g_lm, prompt, 3, &g, &a, &na, &e), 0, "%s", e.msg);
    cr_assert_eq(rl_sample(&g_lm, prompt, 3, &k1, &b, &nb, &e), 0, "%s", e.msg);
    cr_assert(na == nb && !memcmp(a, b, sizeof *a * (size_t)na), "top_k 1 draws the argmax");
    cr_assert_eq(rl_sample(&g_lm, prompt, 3, &hot, &c, &nc, &e), 0, "%s", e.msg);
    cr_assert_eq(rl_sample(&g_lm, prompt, 3, &hot, &d, &nd, &e), 0, "%s", e.msg);
    cr_assert(nc == nd && !memcmp(c, d, sizeof *c * (size_t)nc), "one seed, one draw");
    /* a temperature of 50 is close to uniform over 50 ids: 8 draws equal to
     * the greedy ones would be a sampler that does not sample */
    cr_assert(memcmp(a, c, sizeof *a * (size_t)na) != 0, "a hot sample differs from the greedy one");
    free(a), free(b), free(c), free(d);
}

Test(sample, an_empty_prompt_or_an_id_outside_the_vocabulary_is_einput, .init = setup, .fini = teardown) {
    rl_sample_opts o = {.max_new_tokens = 2, .eos_id = -1};
    int32_t *out = NULL, bad[1] = {50};
    int n;
    rl_err e = {0};
    cr_assert_eq(rl_sample(&g_lm, bad, 0, &o, &out, &n, &e), RL_EINPUT);
    cr_assert_eq(rl_sample(&g_lm, bad, 1, &o, &out, &n, &e), RL_EINPUT);
    cr_assert(strstr(e.msg, "50") && out == NULL, "%s", e.msg);
}

Test(sample, text_bytes_go_in_after_the_frame_and_come_out_without_it, .init = setup, .fini = teardown) {
    /* byte-level with a 50-id model: the frame token 0 first, then the
     * prompt's bytes (all below 50), the greedy tokens after them */
    rl_sample_opts o = {.max_new_tokens = 4, .eos_id = -1};
    const rl_doc_frame frame = {.before = {0}, .nbefore = 1, .eos = -1};
    char *text;
    size_t len;
    rl_err e = {0};
    cr_assert_eq(rl_sample_text(&g_lm, NULL, &frame, "\x01\x02\x03", &o, &text, &len, &e), 0, "%s", e.msg);
    int32_t seq[8] = {0, 1, 2, 3};
    for (int i = 4; i < 8; i++) seq[i] = argmax_next(seq, i);
    cr_assert_eq(len, 7);
    for (int i = 0; i < 7; i++) cr_assert_eq((unsigned char)text[i], seq[i + 1], "byte %d", i);
    free(text);
}

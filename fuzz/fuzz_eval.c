/* fuzz/fuzz_eval.c: HellaSwag eval files (eval.c): eval_parse of the input as
 * a whole file (vocabulary 50257), then every example's four rows at the
 * longest example's length and its choice from made-up losses; a row whose
 * scored positions leave [0, T) or whose ids leave the vocabulary traps.
 * Seed: fuzz/seeds.sh's two-example file. */
#include <stdint.h>
#include <stdlib.h>
#include "eval.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[512];
    EvalSet es;
    if (eval_parse(&es, "fuzz", data, size, 50257, err, sizeof err) != 0) return 0;
    int T = es.max_tokens;
    int *in = malloc(sizeof(int) * EVAL_COMPLETIONS * T), *tg = malloc(sizeof(int) * EVAL_COMPLETIONS * T);
    float *loss = malloc(sizeof(float) * EVAL_COMPLETIONS * T);
    for (int i = 0; i < es.n; i++) {
        int from[EVAL_COMPLETIONS], to[EVAL_COMPLETIONS];
        if (eval_rows(&es, i, T, in, tg, from, to) != 0) __builtin_trap();   /* T is the longest */
        if (T > 1 && eval_rows(&es, i, eval_example_tokens(&es, i) - 1, in, tg, from, to) == 0) __builtin_trap();
        eval_rows(&es, i, T, in, tg, from, to);
        for (int k = 0; k < EVAL_COMPLETIONS * T; k++) {
            if (in[k] < 0 || in[k] >= 50257 || tg[k] < 0 || tg[k] >= 50257) __builtin_trap();
            loss[k] = (float)(in[k] % 7);
        }
        for (int c = 0; c < EVAL_COMPLETIONS; c++)
            if (from[c] < 0 || to[c] <= from[c] || to[c] > T) __builtin_trap();
        int pick = eval_choose(loss, T, from, to, NULL);
        if (pick < 0 || pick >= EVAL_COMPLETIONS) __builtin_trap();
    }
    free(in);
    free(tg);
    free(loss);
    eval_free(&es);
    return 0;
}

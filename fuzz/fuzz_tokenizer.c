/* fuzz/fuzz_tokenizer.c: llm.c tokenizer files (data.c): data_tokenizer_parse
 * of the input, then the text of a few ids in and out of range. Seed:
 * fuzz/seed.c's tokenizer file. */
#include <stdint.h>
#include <string.h>
#include "data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[512];
    Tokenizer t;
    if (data_tokenizer_parse(&t, "fuzz", data, size, err, sizeof err) != 0) return 0;
    size_t n = 0;
    for (int id = -1; id <= t.vocab; id++) {
        const char *s = data_token_text(&t, id);
        if (s) n += strlen(s);
    }
    data_tokenizer_free(&t);
    return (int)(n & 0);
}

/* Reads doubles (their bits, hex, one a line) and writes each as render_repr_double writes
 * it: _render_core.h compiled alone, without Python (tests/test_render_core.py). */
#include "_render_core.h"
int main(void) {
    char line[128], out[64];
    while (fgets(line, sizeof line, stdin)) {
        unsigned long long bits = strtoull(line, NULL, 16);
        double v; memcpy(&v, &bits, 8);
        int n = render_repr_double(out, sizeof out, v);
        if (n < 0) { puts("ERR"); continue; }
        fwrite(out, 1, (size_t)n, stdout); putchar('\n');
    }
    return 0;
}

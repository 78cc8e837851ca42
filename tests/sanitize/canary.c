/* make sanitize's canary (tests/sanitize/run.sh): one use after free for ASan and one signed
 * overflow for UBSan, built with the same flags as csrc/ in build/sanitize. The run starts by
 * proving that each one ends its process and leaves a report, so a run that finds nothing
 * has not merely failed to look (a preload or an option gone wrong). */
#include <stdlib.h>

int canary_use_after_free(int i) {
    volatile int *a = malloc(4 * sizeof *a);
    a[i] = 1;
    free((void *)a);
    return a[i];
}

int canary_signed_overflow(int x) { return x + 1; }

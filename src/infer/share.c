#include "infer/share.h"

/* Decode under another busy process. A step crosses dozens of parallel regions, each ending at a
 * barrier; when another process's threads share the cores, one of ours is often off its core at
 * a barrier and the others wait for the scheduler to bring it back, so two multi-thread decoders
 * on the same cores make far fewer tokens between them than one alone
 * (bench/quant/two_decoders.sh). One thread never waits for another. So full-team decode steps
 * are timed in windows: a window whose threads got less than SHARE_BUSY of the cores' time
 * (process CPU time over wall time times threads: near 1 alone with tlm's bounded spin, above
 * 0.7 with passive waits, about half for two decoders sharing the cores) counts as shared, and
 * SHARE_WINDOWS of them in a row send the next `backoff` decode steps to one thread. Then the
 * full team is tried again: a trial that still looks shared doubles the next run on one thread
 * (up to SHARE_MAX), one that does not resets it to SHARE_MIN; a run is also at least SHARE_RATIO
 * times the steps of the shared windows before it. Prompts always take the full
 * team: their regions are long and their barriers few. */
int infer_share_team(infer_share *sh, int full, int decode, int ignore) {
    if (ignore || !decode || full < 2) return full;
    if (sh->low > 0) {
        sh->low--;
        return 1;
    }
    return full;
}

void infer_share_after(infer_share *sh, int full, double wall, double cpu) {
    if (!sh->backoff) sh->backoff = SHARE_MIN;
    sh->wall += wall;
    sh->cpu += cpu;
    sh->steps++;
    if (sh->wall < SHARE_WINDOW) return;
    double busy = sh->cpu / (sh->wall * full);
    int steps = sh->steps;
    sh->wall = sh->cpu = 0;
    sh->steps = 0;
    if (busy >= SHARE_BUSY) {
        sh->slow = 0;
        sh->slow_steps = 0;
        if (sh->trial) sh->backoff = SHARE_MIN;
        sh->trial = 0;
        return;
    }
    sh->slow_steps += steps;
    if (++sh->slow < SHARE_WINDOWS) return;
    if (sh->trial && sh->backoff < SHARE_MAX) sh->backoff *= 2;
    long run = (long)SHARE_RATIO * sh->slow_steps;
    sh->low = run > sh->backoff ? (run < SHARE_MAX ? (int)run : SHARE_MAX) : sh->backoff;
    sh->slow = 0;
    sh->slow_steps = 0;
    sh->trial = 1;
}

/* Decode steps fall back to one thread while the cores look shared with another process
 * (src/infer/share.c): the controller fed windows of given busy shares. Whether the results are
 * the same on one thread as on two is test_generate's test_team_invariant. */
#include "harness.h"
#include "infer/share.h"

/* Feeds full-team decode steps of `each` seconds at this busy share until one closes a window
 * (adds their count to *fed when given); returns the team the next decode step gets. */
static int window_of(infer_share *sh, double busy, double each, int *fed) {
    int k = 0;
    do {
        infer_share_after(sh, 2, each, each * 2 * busy);
        k++;
    } while (sh->steps);
    if (fed) *fed += k;
    return infer_share_team(sh, 2, 1, 0);
}

/* A window of one 55 ms step: SHARE_RATIO times two such windows stays under SHARE_MIN. */
static int window(infer_share *sh, double busy) { return window_of(sh, busy, 0.055, NULL); }

/* Counts the decode steps given one thread from now on, until the full team comes back. */
static int run_on_one(infer_share *sh, int first) {
    int n = first == 1;
    while (first == 1 && infer_share_team(sh, 2, 1, 0) == 1) n++;
    return n;
}

int main(void) {
    infer_share sh = {0};
    /* Alone (busy about 1): always the full team. */
    for (int k = 0; k < 10; k++) CHECK(window(&sh, 0.95) == 2, "alone, window %d", k);
    /* One shared window is not enough; the second in a row sends SHARE_MIN steps to one. */
    CHECK(window(&sh, 0.5) == 2, "one shared window");
    int t = window(&sh, 0.5);
    CHECK(t == 1, "two shared windows in a row: team %d", t);
    int n = run_on_one(&sh, t);
    CHECK(n == SHARE_MIN, "first run on one thread: %d steps", n);
    /* Prompts keep the full team even now; the ignore switch too. */
    sh.low = 5;
    CHECK(infer_share_team(&sh, 2, 0, 0) == 2 && sh.low == 5, "prompt step on the full team");
    CHECK(infer_share_team(&sh, 2, 1, 1) == 2 && sh.low == 5, "ignored");
    CHECK(infer_share_team(&sh, 1, 1, 0) == 1 && sh.low == 5, "a team of one stays one");
    sh.low = 0;
    /* The trial still looks shared: the next run is twice as long, then four times. */
    CHECK(window(&sh, 0.5) == 2, "trial, first window");
    n = run_on_one(&sh, window(&sh, 0.5));
    CHECK(n == 2 * SHARE_MIN, "second run: %d steps", n);
    CHECK(window(&sh, 0.45) == 2, "trial 2, first window");
    n = run_on_one(&sh, window(&sh, 0.45));
    CHECK(n == 4 * SHARE_MIN, "third run: %d steps", n);
    /* A trial that looks alone resets the run length. */
    CHECK(window(&sh, 0.9) == 2, "trial passes");
    CHECK(window(&sh, 0.5) == 2, "shared again, first window");
    n = run_on_one(&sh, window(&sh, 0.5));
    CHECK(n == SHARE_MIN, "after a passed trial: %d steps", n);
    /* Shared and alone windows alternating never fall back. */
    for (int k = 0; k < 3; k++) window(&sh, 0.9);
    for (int k = 0; k < 10; k++) {
        CHECK(window(&sh, k % 2 ? 0.5 : 0.61) == 2, "alternating, window %d", k);
    }
    /* Short steps (a small model's): the run on one thread is at least SHARE_RATIO times the
     * full-team steps of the shared windows before it, which then weigh little. */
    infer_share fast = {0};
    int fed = 0;
    window_of(&fast, 0.9, 0.0011, NULL);
    CHECK(window_of(&fast, 0.5, 0.0011, &fed) == 2, "fast model, one shared window");
    n = run_on_one(&fast, window_of(&fast, 0.5, 0.0011, &fed));
    CHECK(fed > 80 && n == SHARE_RATIO * fed, "fast model: %d steps on one thread after %d shared",
          n, fed);
    infer_share faster = {0};
    window_of(&faster, 0.5, 0.0001, NULL);
    n = run_on_one(&faster, window_of(&faster, 0.5, 0.0001, NULL));
    CHECK(n == SHARE_MAX, "the ratio's run is capped too: %d steps", n);
    /* The run length stops doubling at SHARE_MAX. */
    infer_share cap = {.backoff = SHARE_MAX, .trial = 1};
    window(&cap, 0.3);
    n = run_on_one(&cap, window(&cap, 0.3));
    CHECK(n == SHARE_MAX, "capped run: %d steps", n);
    return t_finish("test_share");
}

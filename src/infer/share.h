#ifndef TLM_INFER_SHARE_H
#define TLM_INFER_SHARE_H

/* Decode steps on one thread while the cores look shared with another process (share.c). */
typedef struct {
    int low;          /* decode steps left on one thread */
    int backoff;      /* length of the next run on one thread (0: SHARE_MIN) */
    int slow;         /* windows in a row that looked shared */
    int trial;        /* the full team is back on trial after a run on one thread */
    int steps;        /* full-team decode steps in this window */
    int slow_steps;   /* full-team decode steps in the shared windows in a row */
    double wall, cpu; /* this window's full-team decode steps: wall time, process CPU time */
} infer_share;

/* Less than this share of the cores' time in a window's wall time counts as shared. */
#define SHARE_BUSY 0.6
/* Seconds of full-team decode steps per window; the process's CPU time of threads running on
 * other cores is brought up to date at scheduler ticks (4 ms), which one step does not average
 * out. */
#define SHARE_WINDOW 0.05
#define SHARE_WINDOWS 2 /* shared windows in a row that send decode steps to one thread */
#define SHARE_MIN 32    /* decode steps of the first run on one thread */
#define SHARE_MAX 4096  /* the most, doubled at each trial that still looks shared */
/* A run on one thread is at least this many times the full-team steps that the shared windows
 * before it took: a fast model's steps are short, and SHARE_MIN of them after each pair of
 * full-team windows would leave most of the time to the trials, whose steps wait at every fork
 * for a thread the other process holds (bench/quant/two_decoders.sh on a small model). */
#define SHARE_RATIO 8

/* The team for the next step: 1 or full. decode: the step has at most one new id per sequence.
 * ignore: never fall back (TLM_SHARED_CORES=ignore). */
int infer_share_team(infer_share *sh, int full, int decode, int ignore);

/* After a full-team decode step: its wall and process CPU time in seconds. */
void infer_share_after(infer_share *sh, int full, double wall, double cpu);

#endif

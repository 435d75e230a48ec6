#!/usr/bin/env python3
"""On paper: the communication share of a ZeRO-1 training step of gpt2-124M-like for 8, 64 and
512 ranks over 10 and 100 Gb/s links, and what overlapping the reduce-scatter with the backward
pass (bucketed, as DDP does) would save.

Model: per step each rank sends and receives (N-1)/N of the fp32 gradient in a ring
reduce-scatter and (N-1)/N of the parameters in a ring all-gather, each in N-1 rounds of latency
ALPHA; compute is the rank's share of the global batch at the rank's measured training
throughput, the backward pass 2/3 of it. Overlap hides min(reduce-scatter, backward).
  python3 bench/mpi/paper.py [TOKENS_PER_S_PER_RANK] [GLOBAL_BATCH_TOKENS]
"""
import sys

P = 123_551_232  # tlm info -c bench/generate/gpt2-124m-like.json
tps = float(sys.argv[1]) if len(sys.argv) > 1 else 428.0  # bench/README.md, 2 threads
batch = int(sys.argv[2]) if len(sys.argv) > 2 else 512 * 1024  # GPT-2's 0.5M tokens per step
ALPHA = 25e-6  # seconds per message round over Ethernet with TCP

print(f"gpt2-124M-like ({P} parameters), global batch {batch} tokens, {tps:.0f} tokens/s per "
      f"rank, latency {ALPHA * 1e6:.0f} us per round")
print("| ranks | link | compute/step | reduce-scatter | all-gather | comm share | "
      "with overlap | saved by overlap |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
for n in (8, 64, 512):
    compute = batch / n / tps
    for gbps in (10, 100):
        bw = gbps * 1e9 / 8
        one = (n - 1) / n * 4 * P / bw + (n - 1) * ALPHA
        comm = 2 * one
        share = comm / (compute + comm)
        hidden = min(one, compute * 2 / 3)
        share_ov = (comm - hidden) / (compute + comm - hidden)
        print(f"| {n} | {gbps} Gb/s | {compute:.2f} s | {one:.3f} s | {one:.3f} s | "
              f"{100 * share:.1f}% | {100 * share_ov:.1f}% | {hidden:.3f} s/step |")

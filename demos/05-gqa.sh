#!/usr/bin/env bash
# Grouped-query attention: 8 query heads share 2 K/V heads. Watch the smaller K/V projections
# and the repeat_interleave step that hands each K/V head to 4 query heads.
set -euo pipefail

mha-trace shapes --batch 1 --seq 6 --d-model 64 --heads 8 --kv-heads 2
echo
echo "# Which query heads read which K/V head, on the chapter's example split into 4 heads."
mha-trace heads --heads 4 --kv-heads 2 --head 1
echo
echo "# What it saves at LLaMA-2 70B (64 query heads, 8 K/V heads), batch 8 at 4096 tokens."
# (--format json makes the figures easy to pick out in a script)
mha-trace cost --preset llama2-70b --batch 8 --dtype float16 --format markdown | grep "KV cache"

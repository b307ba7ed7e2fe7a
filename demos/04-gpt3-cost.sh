#!/usr/bin/env bash
# What attention costs at GPT-3 scale, every figure from first principles.
# Compare the KV-cache line with the chapter's "~3 GB in fp16".
set -euo pipefail

mha-trace cost --preset gpt3-175b --seq 2048 --dtype float16 --formulas

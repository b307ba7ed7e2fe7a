#!/usr/bin/env bash
# L04, "Shape Transformation Table": the lecture's table, captured from a real forward pass.
# Run as it is: bash demos/01-l04-shape-table.sh
set -euo pipefail

echo "# Batch 2, 10 tokens, d_model 512, 8 heads of d_k = 64: watch dims 1 and 2 swap twice,"
echo "# once to give every head its own slice (.transpose(1, 2)), once to merge them back."
mha-trace shapes --batch 2 --seq 10 --d-model 512 --heads 8
echo
echo "# The same code at GPT-3 scale on the meta device: real shapes and strides, no memory used."
mha-trace shapes --device meta --batch 1 --seq 2048 --d-model 12288 --heads 96 --width 100 | tail -n 5

#!/usr/bin/env bash
# Chapter exercise 2 and the head-count explorer: the same 4-dim Q, K, V split into
# 1, 2 and 4 heads. With 4 heads d_k = 1: each score is a product of two numbers.
set -euo pipefail

mha-trace compare --heads 1,2,4
echo
echo "# Exercise 5, head pruning: drop head 2 and measure how far each token's output moves."
mha-trace ablate --head 2

#!/usr/bin/env bash
# Chapter 2.3, "Step-by-Step Calculation": the token "cat" through both heads of
# "The cat sat on mat", every dot product written out, then the concatenation.
set -euo pipefail

echo "# Head 1 sees dims 0-1, head 2 sees dims 2-3 of the same Q, K, V."
mha-trace explain --token cat
echo
echo "# The whole picture: both heads' weight matrices, their average and the output."
mha-trace heads

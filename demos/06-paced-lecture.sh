#!/usr/bin/env bash
# A paced lecture: each command prints one table row or section per key press (--step), so the
# room reads along; q shows the rest of a command at once. Piped (or in CI) --step does nothing
# and the script prints everything, so it is tested like the others.
# Run as it is, on the projector: bash demos/06-paced-lecture.sh
set -euo pipefail

pause() { if [ -t 0 ] && [ -t 1 ]; then read -rsn1 -p "$1" && echo; else echo "$1"; fi; }

echo "# 1. The shapes, one op at a time: view and transpose move no data; contiguous copies."
mha-trace shapes --seq 5 --d-model 8 --heads 2 --step
pause "# (any key: the chapter's numbers)"
echo "# 2. 'cat' through both heads, one key's dot product at a time."
mha-trace explain --token cat --step
pause "# (any key: every head's weights)"
echo "# 3. Both heads' weight matrices, a head per key press."
mha-trace heads --step
echo "# Now live: mha-trace explore (1-5 panes, [ ] heads, + - re-split, m mask, space ablate, q quit)."

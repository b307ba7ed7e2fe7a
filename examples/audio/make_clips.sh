#!/usr/bin/env bash
# The spoken examples: Debian's espeak-ng 1.51 (voice en-gb-x-rp, 130 words a minute) writes 22,050 Hz
# WAVs; mha-trace's own reader resamples them to 16 kHz, written back as 16-bit mono PCM.
# The sentences are this project's; eSpeak NG's output is free to use (its licence covers the program,
# not what it says).
set -euo pipefail
cd "$(dirname "$0")"
say() {
    espeak-ng -v en-gb-x-rp -s 130 -w "/tmp/$1.22k.wav" "$2"
    python - "$1" <<'PY'
import sys, wave
import numpy as np
from mha_trace.io.audio import read_wav
name = sys.argv[1]
pcm = np.clip(np.round(read_wav(f"/tmp/{name}.22k.wav") * 32767), -32768, 32767).astype("<i2")
with wave.open(f"{name}.wav", "wb") as w:
    w.setnchannels(1), w.setsampwidth(2), w.setframerate(16000), w.writeframes(pcm.tobytes())
PY
}
say cat "The cat sat on the mat."
say animal "The animal did not cross the street because it was too tired."
say attention "Attention lets every word look at every other word in the sentence."

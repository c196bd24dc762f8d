"""A task (no TensorFlow) that writes output the way Keras' `fit(verbose=1)`
does on a pipe: per epoch, hundreds of progress states joined by backspaces
and "\r", then the epoch's final state and "\n" (over 8 KiB per epoch).
Then, with `giant`, one line of 10,000,000 bytes.

    progress_bar.py [giant]
"""

import sys

out = sys.stdout
width = 0
for epoch in range(1, 3):
    out.write(f"Epoch {epoch}/2\n")
    for step in range(1, 401):
        text = (f"\x1b[1m{step:3d}/400\x1b[0m \x1b[32m{'━' * (step // 20)}\x1b[0m"
                f" - loss: {1.0 / (epoch * step):.4f}")
        if step == 400:
            text = f"\x1b[1m400/400\x1b[0m 1s 2ms/step - loss: 0.{epoch}234 - acc: 0.9{epoch}00"
        out.write("\b" * width + "\r" + text + ("\n" if step == 400 else ""))
        width = len(text)
    out.flush()
if sys.argv[1:] == ["giant"]:
    out.write("y" * 10_000_000 + "\n")
out.write("done\n")

"""mgpu-launch: run a TensorFlow/Keras training script on many hosts.

This file is shipped to worker hosts together with the agent, the bootstrap
and the runtime, so it must stay import-free.
"""

__version__ = "0.1.0"

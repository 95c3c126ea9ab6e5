import os

# Tests share 2 cores: keep torch from oversubscribing them in every process.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import os, sys
os.environ.setdefault("PAGEDLAB_DEVICE", "emulate")
sys.path.insert(0, "labs/lab04_decode_kernels")
from reference.emulate import racecheck
import importlib.util
impl_dir = os.environ.get("IMPL", "solutions/lab04_decode_kernels")
from reference import loader  # noqa

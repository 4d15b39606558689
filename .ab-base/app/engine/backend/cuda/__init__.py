"""The CUDA backend: the op set of `backend/base.py` on an NVIDIA GPU through CuPy (see `backend.py`)."""

"""What airstream reads from the process and the machine it runs on: every environment variable
it reads (``environment.py``), the OpenMP runtime torch's CPU kernels use (``openmp.py``), what
``airstream run`` sets before torch loads (``launch.py``, which with ``openmp.py`` imports nothing
from torch), the cache directory (``cache_dir.py``) and the stream costs calibrated on this
machine (``calibration.py``).

Layer: base. May import: errors, options.
"""

"""Sources of the compiled planning engine (``engine.cpp``) and its build step (``build.py``)."""

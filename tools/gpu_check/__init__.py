"""The GPU check behind ``tools/gpu-check`` (its docstring says what it runs and how to read the
verdict): the steps and their limits (``steps``), what the machine has (``environment``), running
a step's processes (``processes``), the checks run in a process of their own (``checks``), and the
run with its verdict (``run``)."""

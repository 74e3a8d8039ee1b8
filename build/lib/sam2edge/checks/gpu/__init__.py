"""GPU check: run .tflite graphs on the GPU delegate (software or real) against the CPU, in subprocesses."""

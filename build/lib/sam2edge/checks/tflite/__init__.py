"""Tools over .tflite flatbuffers: the GPU lint and graph slicing."""

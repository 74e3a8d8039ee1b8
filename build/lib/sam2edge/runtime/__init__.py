"""Using the model: preprocessing, host prompt encoding, backends and the predictor."""

from sam2edge.runtime.predictor import PredictorError, Sam2Predictor

__all__ = ["PredictorError", "Sam2Predictor"]

"""Accuracy as a local `evaluate` metric module: the share of predictions equal to the references."""

import datasets
import evaluate

_DESCRIPTION = "Accuracy: the proportion of predictions equal to their reference, (TP + TN) / (all predictions)."
_KWARGS_DESCRIPTION = """
Args:
    predictions (`list` of `int`): Predicted labels.
    references (`list` of `int`): Ground-truth labels.
    normalize (`bool`): Return the fraction (default) rather than the count of correct predictions.
    sample_weight (`list` of `float`): Weights of the examples (default: all 1).
Returns:
    accuracy (`float`): In [0, 1] when `normalize`, else the (weighted) count of correct predictions.
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class Accuracy(evaluate.Metric):
    """Accuracy of integer class predictions."""

    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation="",
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {"predictions": datasets.Value("int64"), "references": datasets.Value("int64")}
            ),
        )

    def _compute(self, predictions, references, normalize=True, sample_weight=None):
        if len(predictions) != len(references):
            raise ValueError(f"{len(predictions)} predictions for {len(references)} references.")
        weights = sample_weight if sample_weight is not None else [1.0] * len(references)
        correct = sum(w for p, r, w in zip(predictions, references, weights, strict=True) if int(p) == int(r))
        if not normalize:
            return {"accuracy": float(correct)}
        total = float(sum(weights))
        return {"accuracy": correct / total if total else 0.0}

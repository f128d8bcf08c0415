"""Reload exported AoT folders in a fresh interpreter through the Auto classes with `trust_remote_code=True`.

Run as a script (not imported by the package): `aot_transformers` is made unimportable first, so only the code
files inside the folders can make the models work — exactly what a user with plain `transformers` gets. Prints
one JSON line: the generated sample and the image classifier's accuracy on the given test images.
"""

from __future__ import annotations

import argparse
import json
import sys

sys.modules["aot_transformers"] = None  # type: ignore[assignment]  # prove the folders are self-contained

REPORT_PREFIX = "AOT_RELOAD_REPORT "


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--lm", help="exported causal-LM folder")
    parser.add_argument("--prompt", default="The ")
    parser.add_argument("--max-new-tokens", type=int, default=60)
    parser.add_argument("--image", help="exported image-classifier folder")
    parser.add_argument("--test-images", help=".npz with uint8 `images` (N, H, W[, C]) and int `labels` (N,)")
    args = parser.parse_args()

    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline

    report = {}
    if args.lm:
        tokenizer = AutoTokenizer.from_pretrained(args.lm, trust_remote_code=True)
        model = AutoModelForCausalLM.from_pretrained(args.lm, trust_remote_code=True).eval()
        report["lm_class"] = f"{type(model).__module__}.{type(model).__name__}"
        inputs = tokenizer(args.prompt, return_tensors="pt")
        torch.manual_seed(0)
        with torch.no_grad():
            output = model.generate(
                **inputs,
                max_new_tokens=args.max_new_tokens,
                do_sample=True,
                top_k=40,
                temperature=0.8,
                pad_token_id=tokenizer.pad_token_id,
            )
        report["sample"] = tokenizer.decode(output[0], skip_special_tokens=True)
    if args.image:
        from PIL import Image

        classifier = pipeline("image-classification", model=args.image, trust_remote_code=True)
        model = classifier.model  # AutoModelForImageClassification's class, from the folder's code
        report["image_class"] = f"{type(model).__module__}.{type(model).__name__}"
        if args.test_images:
            data = np.load(args.test_images, allow_pickle=False)
            images = [Image.fromarray(array) for array in data["images"]]
            predictions = classifier(images, top_k=1, batch_size=64)
            label_names = [model.config.id2label[int(i)] for i in data["labels"]]
            correct = sum(pred[0]["label"] == name for pred, name in zip(predictions, label_names, strict=True))
            report["test_accuracy"] = correct / len(images)
            report["test_images"] = len(images)
    print(REPORT_PREFIX + json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

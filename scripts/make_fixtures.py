"""Write eval/fixtures/: synthetic rows in the exact columns, types and file layout of the public datasets of the tasks.

The rows are written here from small word lists (no real dataset text), with the same `datasets` features as
the Hub (ClassLabel columns keep their class names in the Parquet metadata) and laid out as the Hub's Parquet
export, `<dataset id>/<config>/<split>/0000.parquet`, so `clef-quant build-data --source eval/fixtures` runs the
same loading code as `--source hub`. The output is deterministic: rerun after changing this script and commit
the files.

    python scripts/make_fixtures.py [--out eval/fixtures] [--rows 32]

A few rows exercise edge cases of the real data: ARC questions labelled 1-4 or with 3 or 5 choices, and one
BANKING77 text that appears in both train and test (build-data must keep it out of calibration).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BANKING77_NAMES = json.loads(
    '["activate_my_card", "age_limit", "apple_pay_or_google_pay", "atm_support", "automatic_top_up", '
    '"balance_not_updated_after_bank_transfer", "balance_not_updated_after_cheque_or_cash_deposit", '
    '"beneficiary_not_allowed", "cancel_transfer", "card_about_to_expire", "card_acceptance", "card_arrival", '
    '"card_delivery_estimate", "card_linking", "card_not_working", "card_payment_fee_charged", '
    '"card_payment_not_recognised", "card_payment_wrong_exchange_rate", "card_swallowed", "cash_withdrawal_charge", '
    '"cash_withdrawal_not_recognised", "change_pin", "compromised_card", "contactless_not_working", '
    '"country_support", "declined_card_payment", "declined_cash_withdrawal", "declined_transfer", '
    '"direct_debit_payment_not_recognised", "disposable_card_limits", "edit_personal_details", "exchange_charge", '
    '"exchange_rate", "exchange_via_app", "extra_charge_on_statement", "failed_transfer", "fiat_currency_support", '
    '"get_disposable_virtual_card", "get_physical_card", "getting_spare_card", "getting_virtual_card", '
    '"lost_or_stolen_card", "lost_or_stolen_phone", "order_physical_card", "passcode_forgotten", '
    '"pending_card_payment", "pending_cash_withdrawal", "pending_top_up", "pending_transfer", "pin_blocked", '
    '"receiving_money", "Refund_not_showing_up", "request_refund", "reverted_card_payment?", '
    '"supported_cards_and_currencies", "terminate_account", "top_up_by_bank_transfer_charge", '
    '"top_up_by_card_charge", "top_up_by_cash_or_cheque", "top_up_failed", "top_up_limits", "top_up_reverted", '
    '"topping_up_by_card", "transaction_charged_twice", "transfer_fee_charged", "transfer_into_account", '
    '"transfer_not_received_by_recipient", "transfer_timing", "unable_to_verify_identity", "verify_my_identity", '
    '"verify_source_of_funds", "verify_top_up", "virtual_card_not_working", "visa_or_mastercard", '
    '"why_verify_identity", "wrong_amount_of_cash_received", "wrong_exchange_rate_for_cash_withdrawal"]'
)
MMLU_SUBJECTS = [
    "abstract_algebra", "astronomy", "college_biology", "high_school_chemistry", "high_school_geography",
    "international_law", "marketing", "nutrition", "philosophy", "world_religions",
]  # fmt: skip
NOUNS = [
    "river", "forest", "engine", "battery", "market", "village", "planet", "cell", "bridge", "library", "garden",
    "harbor", "volcano", "glacier", "orchestra", "factory", "museum", "satellite", "desert", "island",
]  # fmt: skip
ADJECTIVES = ["old", "large", "quiet", "bright", "narrow", "busy", "cold", "ancient", "modern", "hidden"]
VERBS = ["moves", "changes", "grows", "cools", "expands", "collects", "reflects", "carries", "protects", "stores"]
PEOPLE = ["A woman", "A man", "Two kids", "A chef", "The coach", "A teenager", "An old man", "The team"]
ACTIVITIES = [
    "Baking cookies", "Washing a car", "Playing guitar", "Painting a fence", "Making a sandwich",
    "Walking the dog", "Brushing teeth", "Ice fishing", "Cleaning windows", "Tying shoes",
]  # fmt: skip
ACTIONS = [
    "picks up a brush",
    "opens the box",
    "starts the engine",
    "pours the water",
    "turns around",
    "waves at the camera",
    "kneels on the grass",
    "lifts the lid",
    "steps back",
    "reads the label",
]


def sentence(rng: random.Random) -> str:
    return f"The {rng.choice(ADJECTIVES)} {rng.choice(NOUNS)} {rng.choice(VERBS)} the {rng.choice(NOUNS)}."


def passage(rng: random.Random, sentences: int) -> str:
    return " ".join(sentence(rng) for _ in range(sentences))


# -- one generator per dataset: (rows of one split) -------------------------------------------------------------


def banking77(rng: random.Random, count: int, split: str) -> dict[str, list[Any]]:
    openers = ["Hi,", "Hello.", "Quick question:", "Help!", "Excuse me,", ""]
    texts, labels = [], []
    for _ in range(count):
        label = rng.randrange(len(BANKING77_NAMES))
        topic = BANKING77_NAMES[label].replace("_", " ").replace("?", "").lower()
        texts.append(f"{rng.choice(openers)} I have a problem with {topic}, what should I do?".strip())
        labels.append(label)
    # The real splits repeat a few texts; build-data must not put such a text in calibration.
    texts[0], labels[0] = "How do I activate my new card?", 0
    return {"text": texts, "label": labels}


def ai2_arc(rng: random.Random, count: int, split: str) -> dict[str, list[Any]]:
    prefix = {"train": "Mercury_", "test": "Mercury_SC_"}.get(split, "MCAS_")
    rows: dict[str, list[Any]] = {"id": [], "question": [], "choices": [], "answerKey": []}
    for i in range(count):
        # Mostly four choices labelled A-D; the real data also has 1-4 labels and 3 or 5 choices.
        size = 3 if i % 11 == 5 else 5 if i % 13 == 7 else 4
        labels = [str(n + 1) for n in range(size)] if i % 7 == 3 else [chr(ord("A") + n) for n in range(size)]
        noun = rng.choice(NOUNS)
        rows["id"].append(f"{prefix}{rng.randrange(10**6, 10**7)}")
        rows["question"].append(f"Which property best explains why a {noun} {rng.choice(VERBS)} heat?")
        rows["choices"].append({"text": [f"its {rng.choice(ADJECTIVES)} surface" for _ in labels], "label": labels})
        rows["answerKey"].append(rng.choice(labels))
    return rows


def mmlu(rng: random.Random, count: int, split: str) -> dict[str, list[Any]]:
    rows: dict[str, list[Any]] = {"question": [], "subject": [], "choices": [], "answer": []}
    for _ in range(count):
        subject = rng.choice(MMLU_SUBJECTS)
        rows["question"].append(f"In {subject.replace('_', ' ')}, what {rng.choice(VERBS)} a {rng.choice(NOUNS)}?")
        rows["subject"].append(subject)
        rows["choices"].append([f"The {rng.choice(ADJECTIVES)} {rng.choice(NOUNS)}" for _ in range(4)])
        rows["answer"].append(rng.randrange(4))
    return rows


def hellaswag(rng: random.Random, count: int, split: str) -> dict[str, list[Any]]:
    rows: dict[str, list[Any]] = {key: [] for key in HELLASWAG_COLUMNS}
    for i in range(count):
        activity = rng.choice(ACTIVITIES)
        ctx_a = (
            f"{rng.choice(PEOPLE)} is outside near a {rng.choice(NOUNS)}. {rng.choice(PEOPLE)} {rng.choice(ACTIONS)}."
        )
        ctx_b = rng.choice(["they", "then", "the person"])
        rows["ind"].append(i * 7 + (0 if split == "train" else 24))
        rows["activity_label"].append(activity)
        rows["ctx_a"].append(ctx_a)
        rows["ctx_b"].append(ctx_b)
        rows["ctx"].append(f"{ctx_a} {ctx_b}")
        rows["endings"].append([f"{rng.choice(ACTIONS)} and {rng.choice(ACTIONS)}." for _ in range(4)])
        rows["source_id"].append(f"activitynet~v_{rng.randrange(16**8):08x}")
        rows["split"].append("train" if split == "train" else "val")
        rows["split_type"].append(rng.choice(["indomain", "zeroshot"]))
        rows["label"].append(str(rng.randrange(4)))
    return rows


def anli(rng: random.Random, count: int, split: str) -> dict[str, list[Any]]:
    rows: dict[str, list[Any]] = {"uid": [], "premise": [], "hypothesis": [], "label": [], "reason": []}
    for _ in range(count):
        label = rng.randrange(3)
        noun = rng.choice(NOUNS)
        rows["uid"].append(f"{rng.randrange(16**8):08x}-{rng.randrange(16**4):04x}-{rng.randrange(16**4):04x}")
        rows["premise"].append(f"The {noun} {rng.choice(VERBS)} water every spring. {passage(rng, 2)}")
        rows["hypothesis"].append(
            [
                f"The {noun} {rng.choice(VERBS)} water.",
                f"The {noun} is {rng.choice(ADJECTIVES)}.",
                f"The {noun} never {rng.choice(VERBS)} anything.",
            ][label]
        )
        rows["label"].append(label)
        rows["reason"].append("" if split.startswith("test") else f"The premise says the {noun} does.")
    return rows


def boolq(rng: random.Random, count: int, split: str) -> dict[str, list[Any]]:
    rows: dict[str, list[Any]] = {"question": [], "answer": [], "passage": []}
    for _ in range(count):
        noun = rng.choice(NOUNS)
        rows["question"].append(f"is the {noun} {rng.choice(ADJECTIVES)} in the {rng.choice(NOUNS)}")
        rows["answer"].append(rng.random() < 0.6)
        rows["passage"].append(f"{noun.capitalize()} -- {passage(rng, 3)}")
    return rows


SCIENCEQA_SUBJECTS = ["natural science", "social science", "language science"]
SCIENCEQA_COLUMNS = [
    "image",
    "question",
    "choices",
    "answer",
    "hint",
    "task",
    "grade",
    "subject",
    "topic",
    "category",
    "skill",
    "lecture",
    "solution",
]


def small_image(rng: random.Random) -> Any:
    """A 48 x 32 picture of four coloured blocks (ScienceQA rows carry diagrams and photos)."""
    from PIL import Image

    image = Image.new("RGB", (48, 32))
    for x in (0, 24):
        for y in (0, 16):
            image.paste((rng.randrange(256), rng.randrange(256), rng.randrange(256)), (x, y, x + 24, y + 16))
    return image


def scienceqa(rng: random.Random, count: int, split: str) -> dict[str, list[Any]]:
    """About a third of the rows have no image, as in the real splits (the task skips those)."""
    rows: dict[str, list[Any]] = {column: [] for column in SCIENCEQA_COLUMNS}
    for index in range(count):
        noun = rng.choice(NOUNS)
        choices = [f"the {rng.choice(ADJECTIVES)} {rng.choice(NOUNS)}" for _ in range(rng.choice([2, 3, 4, 5]))]
        rows["image"].append(small_image(rng) if index % 3 else None)
        rows["question"].append(f"Which part of the picture shows the {noun}?")
        rows["choices"].append(choices)
        rows["answer"].append(rng.randrange(len(choices)))
        rows["hint"].append(passage(rng, 1) if rng.random() < 0.7 else "")
        rows["task"].append("closed choice")
        rows["grade"].append(f"grade{rng.randint(1, 12)}")
        rows["subject"].append(rng.choice(SCIENCEQA_SUBJECTS))
        rows["topic"].append(noun)
        rows["category"].append(f"{noun.capitalize()} facts")
        rows["skill"].append(f"Identify the {noun}")
        rows["lecture"].append(passage(rng, 2))
        rows["solution"].append(passage(rng, 1))
    return rows


HELLASWAG_COLUMNS = [
    "ind",
    "activity_label",
    "ctx_a",
    "ctx_b",
    "ctx",
    "endings",
    "source_id",
    "split",
    "split_type",
    "label",
]


def features() -> dict[str, Any]:
    """The Hub's `datasets` features of each dataset (what the Parquet export stores in its metadata)."""
    from datasets import ClassLabel, Features, Image, Sequence, Value

    text = Value("string")
    return {
        "PolyAI/banking77": Features({"text": text, "label": ClassLabel(names=BANKING77_NAMES)}),
        "allenai/ai2_arc": Features(
            {"id": text, "question": text, "choices": Sequence({"text": text, "label": text}), "answerKey": text}
        ),
        "cais/mmlu": Features(
            {
                "question": text,
                "subject": text,
                "choices": Sequence(text),
                "answer": ClassLabel(names=["A", "B", "C", "D"]),
            }
        ),
        "Rowan/hellaswag": Features(
            {
                "ind": Value("int32"),
                "activity_label": text,
                "ctx_a": text,
                "ctx_b": text,
                "ctx": text,
                "endings": Sequence(text),
                "source_id": text,
                "split": text,
                "split_type": text,
                "label": text,
            }
        ),
        "facebook/anli": Features(
            {
                "uid": text,
                "premise": text,
                "hypothesis": text,
                "label": ClassLabel(names=["entailment", "neutral", "contradiction"]),
                "reason": text,
            }
        ),
        "google/boolq": Features({"question": text, "answer": Value("bool"), "passage": text}),
        "derek-thomas/ScienceQA": Features(
            {
                "image": Image(),
                "question": text,
                "choices": Sequence(text),
                "answer": Value("int8"),
                **{column: text for column in SCIENCEQA_COLUMNS[4:]},
            }
        ),
    }


# dataset id -> (config, splits, generator)
DATASETS: dict[str, tuple[str, tuple[str, ...], Callable[[random.Random, int, str], dict[str, list[Any]]]]] = {
    "PolyAI/banking77": ("default", ("test", "train"), banking77),
    "allenai/ai2_arc": ("ARC-Challenge", ("test", "train"), ai2_arc),
    "cais/mmlu": ("all", ("test", "dev"), mmlu),
    "Rowan/hellaswag": ("default", ("validation", "train"), hellaswag),
    "facebook/anli": ("plain_text", ("test_r1", "train_r1", "test_r3", "train_r3"), anli),
    "google/boolq": ("default", ("validation", "train"), boolq),
    "derek-thomas/ScienceQA": ("default", ("test", "train"), scienceqa),
}


def write_fixtures(out: Path, rows: int) -> list[Path]:
    from datasets import Dataset
    from datasets.utils.logging import disable_progress_bar

    disable_progress_bar()
    shutil.rmtree(out, ignore_errors=True)
    written = []
    for dataset_id, (config, splits, generate) in DATASETS.items():
        for split in splits:
            rng = random.Random(f"fixtures/{dataset_id}/{split}")
            table = Dataset.from_dict(generate(rng, rows, split), features=features()[dataset_id])
            path = out / dataset_id / config / split / "0000.parquet"
            path.parent.mkdir(parents=True, exist_ok=True)
            table.to_parquet(str(path))
            written.append(path)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "eval" / "fixtures")
    parser.add_argument("--rows", type=int, default=32, help="rows per split")
    args = parser.parse_args()
    files = write_fixtures(args.out, args.rows)
    total = sum(f.stat().st_size for f in files)
    print(f"wrote {len(files)} files, {total / 1024:.1f} KiB, under {args.out}")


if __name__ == "__main__":
    main()

"""The tasks a Hugging Face folder exports for: each a transformers Auto class and its mapping, and the task a
config's architectures name (`formats.huggingface` builds the model of the task)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trtflow.stage import StageFailed

from .generation import TASK as GENERATION_TASK
from .seq2seq import SPEECH_TASK, TEXT_TASK


@dataclass(frozen=True)
class Task:
    """A task: the transformers Auto classes that build its model (the first whose mapping knows the model type)."""

    name: str
    autos: tuple[tuple[str, str], ...]  # (Auto class, modeling_auto mapping constant)
    what: str


_TASK_LIST = (  # the seq2seq tasks first: BART's masked-LM mapping names BartForConditionalGeneration too
    Task("text2text-generation", (("AutoModelForSeq2SeqLM", "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES"),),
         "an encoder-decoder LM, as encoder and decoder"),
    Task(TEXT_TASK, (("AutoModelForSeq2SeqLM", "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES"),),
         "an encoder-decoder LM for generation: the encoder (-> the cross-attention cache) and one decoder with its "
         "KV cache in and out (formats.seq2seq)"),
    Task("fill-mask", (("AutoModelForMaskedLM", "MODEL_FOR_MASKED_LM_MAPPING_NAMES"),), "masked-token logits"),
    Task("text-classification", (("AutoModelForSequenceClassification",
                                  "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES"),), "one label per text"),
    Task("token-classification", (("AutoModelForTokenClassification", "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES"),),
         "one label per token"),
    Task("question-answering", (("AutoModelForQuestionAnswering", "MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES"),),
         "answer span logits (start_logits, end_logits)"),
    Task("text-generation", (("AutoModelForCausalLM", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"),),
         "next-token logits of a causal LM over the whole sequence (no KV cache)"),
    Task(GENERATION_TASK, (("AutoModelForCausalLM", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"),),
         "a causal LM with its KV cache in and out (Optimum's layout), for generation (formats.generation)"),
    Task("image-classification", (("AutoModelForImageClassification",
                                   "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES"),), "one label per image"),
    Task("object-detection", (("AutoModelForObjectDetection", "MODEL_FOR_OBJECT_DETECTION_MAPPING_NAMES"),),
         "class logits and boxes (logits, pred_boxes)"),
    Task("semantic-segmentation", (("AutoModelForSemanticSegmentation",
                                    "MODEL_FOR_SEMANTIC_SEGMENTATION_MAPPING_NAMES"),), "per-pixel class logits"),
    Task("image-segmentation", (("AutoModelForImageSegmentation", "MODEL_FOR_IMAGE_SEGMENTATION_MAPPING_NAMES"),),
         "masks per query (pred_masks)"),
    Task("universal-segmentation", (("AutoModelForUniversalSegmentation",
                                     "MODEL_FOR_UNIVERSAL_SEGMENTATION_MAPPING_NAMES"),),
         "class and mask logits per query"),
    Task("depth-estimation", (("AutoModelForDepthEstimation", "MODEL_FOR_DEPTH_ESTIMATION_MAPPING_NAMES"),),
         "a depth map (predicted_depth)"),
    Task("zero-shot-image-classification", (("AutoModelForZeroShotImageClassification",
                                             "MODEL_FOR_ZERO_SHOT_IMAGE_CLASSIFICATION_MAPPING_NAMES"),),
         "both towers of a vision-text model (logits_per_image, text_embeds, image_embeds)"),
    Task("image-feature-extraction", (("AutoModel", "MODEL_MAPPING_NAMES"),),
         "the vision tower of a vision-text model (image_embeds), or a vision model's features"),
    Task("text-feature-extraction", (("AutoModel", "MODEL_MAPPING_NAMES"),),
         "the text tower of a vision-text model (text_embeds), or a text model's features"),
    Task("audio-classification", (("AutoModelForAudioClassification",
                                   "MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES"),), "one label per clip"),
    Task("automatic-speech-recognition", (("AutoModelForCTC", "MODEL_FOR_CTC_MAPPING_NAMES"),
                                          ("AutoModelForSpeechSeq2Seq", "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES")),
         "CTC logits per frame, or an encoder-decoder (Whisper) as encoder and decoder"),
    Task(SPEECH_TASK, (("AutoModelForSpeechSeq2Seq", "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES"),),
         "a speech encoder-decoder (Whisper) for generation: the encoder (log-mel features -> the cross-attention "
         "cache) and one decoder with its KV cache in and out (formats.seq2seq)"),
    Task("feature-extraction", (("AutoModel", "MODEL_MAPPING_NAMES"),),
         "the base model's hidden states (an encoder-decoder: encoder and decoder)"),
)
#: Task name -> Task, in the order an architecture is matched (the specific heads before feature-extraction).
TASKS = {task.name: task for task in _TASK_LIST}
_TOWERS = {"image-feature-extraction": ("get_image_features", "image_embeds", ("pixel_values",)),
           "text-feature-extraction": ("get_text_features", "text_embeds", ("input_ids", "attention_mask"))}


def _mapping(constant: str) -> dict[str, Any]:
    from transformers.models.auto import modeling_auto

    return dict(getattr(modeling_auto, constant, {}) or {})


def _names(value: Any) -> tuple[str, ...]:
    return tuple(value) if isinstance(value, (list, tuple)) else (str(value),) if value else ()


def supported_tasks(config: dict[str, Any]) -> list[str]:
    """The tasks transformers can build a model for from this config (its model type), in TASKS' order; the tower
    tasks for a model with a vision and a text tower."""
    model_type = str(config.get("model_type", ""))
    found = [task.name for task in _TASK_LIST if task.name not in _TOWERS
             and any(model_type in _mapping(constant) for _, constant in task.autos)]
    if "feature-extraction" in found and "vision_config" in config and "text_config" in config:
        found[found.index("feature-extraction"):0] = list(_TOWERS)
    return found


def task_of(config: dict[str, Any], task: str | None) -> str:
    """The task: the ``task:`` param, else the one whose mapping names ``config.architectures``' class."""
    if task is not None:
        if task not in TASKS:
            from trtflow.errors import did_you_mean

            suggestion = did_you_mean(task, list(TASKS))
            raise StageFailed(f"task {task!r} is not a task export knows" + (f"; {suggestion}" if suggestion else ""),
                              hint=f"tasks: {', '.join(TASKS)}; leave task out to take it from config.json's "
                              "architectures")
        return task
    found = architecture_task(config)
    if found is not None:
        return found
    supported = supported_tasks(config)
    if "feature-extraction" in supported or not supported:
        return "feature-extraction"
    return supported[0]


def architecture_task(config: dict[str, Any]) -> str | None:
    """The task whose transformers mapping names the class in ``config.architectures`` (None: no task does)."""
    model_type = str(config.get("model_type", ""))
    for architecture in config.get("architectures") or []:
        for candidate in _TASK_LIST:
            if candidate.name in _TOWERS:
                continue
            if any(architecture in _names(_mapping(constant).get(model_type)) for _, constant in candidate.autos):
                return candidate.name
    return None

"""The shortest correct FastAPI + ONNX Runtime service, as a newcomer would write it: a sync route,
one session with ONNX Runtime's own thread defaults, servelab's preprocessing (the same answers).

Not a lab stage: the reference ``servelab benchmark --measure limit`` measures ``fastapi-onnx`` against,
side by side (``uvicorn --app-dir benchmarks simple_app:app``). ``POST /noop/predict`` takes the same body and
answers the same shape without decoding or inferring: what HTTP and JSON alone cost per request.
"""

import os
from pathlib import Path

import onnxruntime as ort
from fastapi import FastAPI, HTTPException
from pydantic import BaseModel

from servelab.core.artifacts import load_manifest
from servelab.core.postprocess import top1
from servelab.core.preprocess import ImageError, decode_base64, preprocess

MODEL_DIR = Path(os.environ.get("MODEL_DIR", "models"))
manifest = load_manifest(MODEL_DIR / "food11.json")
session = ort.InferenceSession(str(MODEL_DIR / "food11.onnx"), providers=["CPUExecutionProvider"])
input_name = session.get_inputs()[0].name
app = FastAPI()


class Request(BaseModel):
    image: str  # base64


class Response(BaseModel):
    prediction: str
    probability: float
    class_index: int


@app.post("/predict")
def predict(request: Request) -> Response:  # a sync route: FastAPI runs it in its thread pool
    try:
        x = preprocess(decode_base64(request.image), **manifest.preprocess_kwargs())
    except ImageError as exc:
        raise HTTPException(400, str(exc)) from None
    [top] = top1(session.run(None, {input_name: x[None]})[0], manifest.classes)
    return Response(prediction=top.label, probability=top.probability, class_index=top.index)


@app.post("/noop/predict")
def noop(request: Request) -> Response:
    return Response(prediction=manifest.classes[0], probability=1.0, class_index=0)


@app.get("/ready")
def ready() -> dict:
    return {"ready": True}

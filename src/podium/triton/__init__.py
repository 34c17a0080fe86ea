"""Triton model repositories served as they are (`podium serve --repository DIR`).

    config          config.pbtxt → ModelConfig (protobuf text format); the allow-list of fields
    package         one model version as a Podium Package (manifest derived from the config)
    scan            the models of a repository folder, and why each refused one is refused
    model_file      loading a model.py with `triton_python_backend_utils` importable
    pb_utils        Podium's `triton_python_backend_utils`
    bls             pb_utils.InferenceRequest(...).exec(): calling other models
    python_backend  Triton's python backend (TritonPythonModel)
    decoupled       a decoupled python model's responses as a stream
    sequence        sequence batching: stateful python models (sequence id/start/end, controls)
    onnx_backend    Triton's onnxruntime backend on Podium's ONNX backend
    libtorch_backend  Triton's pytorch_libtorch backend (TorchScript) on Podium's torch backend
    ensemble        Triton's ensemble scheduling, executed in-process
    snapshot        one version of a model folder copied for `podium announce`
    import_cmd      `podium import`: a version as a podium.json package (python via `shim`)
"""

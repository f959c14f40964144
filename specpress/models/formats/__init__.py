"""Foreign checkpoint layouts as pure codecs (config fields, tensor names, packed codes): the
`speculators` drafter layout vLLM loads, `compressed-tensors` quantized weights, ModelOpt's unified HF
layout. They sit in models/ because the drafter loader reads them back (`models.serving_io`);
`specpress.export.hf` writes them."""

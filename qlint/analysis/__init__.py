"""The island analysis over a lowered program: fp32 islands, constant subgraphs and requantize
pairs, evaluated exhaustively over their input dtype; which exact fold applies to each; why an op
stayed fp32, by ExecuTorch's own quantizer checks; and whether the lowered program can run and
computes what the quantized program computes."""

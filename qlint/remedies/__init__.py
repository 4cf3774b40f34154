"""`--unsafe-fixes`: remedies at the model's source (export and quantization changes that let the
quantizer annotate more), the search that tries each on a target and keeps what helps within the
accuracy guard, and the patch writer that shows a kept remedy as a diff of the factory."""

"""`--unsafe-fixes`: remedies at the model's source (export and quantization changes that let the
quantizer annotate more), the search that tries each on a target and keeps what helps within the
accuracy guard, and the patch writer that shows a kept remedy as a diff of the factory.

One module a remedy, named for it (`channels_last`, `unfused_attention`, `derived_scale_qparams`,
`int8_io`, `int8_layernorm`, `expand_broadcasts`, `conv1d_as_conv2d`), over what they share (`remedy`: the `Build`
record and the `Remedy` hooks);
`all_remedies` is the table of them that `search` and `patch` read."""

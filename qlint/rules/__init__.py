"""What a rule is, without torch: the rule table (code -> catalog entry, scope, the function of
each tier, fix applicability), the YAML catalog it is documented in, the op tables and the step
classification both tiers find islands with, and the builders of a finding's message and details,
so the static tier and the full check say the same thing the same way. What a rule produces is
`qlint.records`."""

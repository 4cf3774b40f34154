"""What a rule is, without torch: the rule table (code -> catalog entry, scope, the function of
each tier, fix applicability), the YAML catalog it is documented in, the finding records every
rule produces and every reporter reads, and the tier-neutral pieces of a finding (its source
line) so the static tier and the full check say the same thing the same way."""

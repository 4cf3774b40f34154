"""Bytes in and out, decided without torch: bounded reads of untrusted files, atomic writes that
never replace what is not a regular file, and the `.pt2` allow-list (`archive`, `wellformed`)
that both tiers read through, so a file either tier refuses is refused by both."""

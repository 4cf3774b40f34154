# Sourced by action.yml's steps: the `args` input as words, with no file able to become an option.
#
# `qlint_words TEXT` sets the array QLINT_WORDS. TEXT is split on whitespace without pathname
# expansion (a bare `$QLINT_ARGS` would glob it against the pull request's files, and a file named
# `--baseline=x.pt2` would then be read as that option). A word with glob characters that does not
# start with `-` is then expanded here, in the current folder, and every path it matches that
# starts with `-` is passed as `./PATH`: the same file, never an option. A glob that matches
# nothing stays the word as written, as bash leaves it.
qlint_words() {
  local word match restore
  local -a words=() matches=()
  IFS=$' \t\n' read -r -d '' -a words <<< "$1" || true
  QLINT_WORDS=()
  restore=$(shopt -p nullglob || true)  # its status is 1 when the option is off
  for word in "${words[@]}"; do
    if [[ $word == -* || $word != *[\*\?\[]* ]]; then
      QLINT_WORDS+=("$word")
      continue
    fi
    shopt -s nullglob
    # shellcheck disable=SC2206  # the one place the pattern is meant to expand
    matches=($word)
    eval "$restore"
    if [ ${#matches[@]} -eq 0 ]; then
      QLINT_WORDS+=("$word")
    fi
    for match in "${matches[@]}"; do
      if [[ $match == -* ]]; then match="./$match"; fi
      QLINT_WORDS+=("$match")
    done
  done
  return 0
}

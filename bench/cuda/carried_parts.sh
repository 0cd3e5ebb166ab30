# Sourced by the device run scripts: a file larger than one call's carry travels in parts made on the
# project machine (split -b 58m -d -a 2 FILE part.; sha256sum FILE > SHA256), one device call each
# while the machine stays warm; the parts wait in a folder of the device machine until joined.
#   stash_part PART DIR          copies one carried part into DIR, prints how many DIR holds
#   join_parts DIR OUT [SHA256]  cats DIR/part.* into OUT (unless OUT exists), checked against the
#                                sha256sum line in SHA256 when given; returns 3 on a mismatch
stash_part() {
  mkdir -p "$2" && cp "$1" "$2"/ && ls "$2" | wc -l
}
join_parts() {
  local dir=$1 out=$2 sha=${3:-}
  [ -s "$out" ] && return 0
  cat "$dir"/part.* > "$out.tmp" && mv "$out.tmp" "$out" || return 1
  if [ -n "$sha" ] && [ "$(sha256sum < "$out" | cut -d' ' -f1)" != "$(cut -d' ' -f1 "$sha")" ]; then
    echo "join_parts: $out does not match $sha (a part missing?)" >&2
    rm -f "$out"
    return 3
  fi
}

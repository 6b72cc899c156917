#!/usr/bin/env bash
# Builds the Debian package `apollo`: the three binaries, the systemd unit,
# the default /etc/apollo/apollo.yaml, man pages and shell completions, and a
# postinst that creates the apollo user. Needs cargo-deb
# (`cargo install cargo-deb`). Extra arguments go to cargo deb (--output …).
#
#   packaging/build-deb.sh                      # release build, then package
#   PROFILE=dev SKIP_BUILD=1 packaging/build-deb.sh --fast --output /tmp/x.deb
set -euo pipefail
cd "$(dirname "$0")/.."
profile=${PROFILE:-release}
dir=$([ "$profile" = dev ] && echo debug || echo "$profile")
if [ -z "${SKIP_BUILD:-}" ]; then
    cargo build --profile "$profile" -p apollo-agent -p apollo-tui --bins
fi
bin=target/$dir
gen=packaging/generated
rm -rf "$gen"
mkdir -p "$gen/man" "$gen/completions"
# Every page: apollo.1 and apollo-run.1, …, apollo-agent.1 and its commands'.
"$bin/apollo" man --dir "$gen/man"
"$bin/apollo-agent" man --dir "$gen/man"
"$bin/apollo-tui" --man > "$gen/man/apollo-tui.1"
gzip -9n "$gen"/man/*.1
# apollo's completion asks the running agent for task names and instance
# ids; the other two complete their flags.
for sh in bash zsh fish; do
    "$bin/apollo" completions $sh > "$gen/completions/apollo.$sh"
    "$bin/apollo-agent" completions $sh > "$gen/completions/apollo-agent.$sh"
    "$bin/apollo-tui" --completions $sh > "$gen/completions/apollo-tui.$sh"
done
cargo deb -p apollo-agent --no-build --profile "$profile" "$@"

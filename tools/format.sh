#!/usr/bin/env bash
# tools/format.sh: the project's C++ in the style of .clang-format, by clang-format 19 (Debian's clang-format-19,
# which cmake/install_deps.sh installs).
#
#   tools/format.sh           formats every tracked C++ file of include/, test/, examples/, bench/ and fuzz/ in place
#   tools/format.sh --check   changes nothing; names each file that is not formatted and exits 1 if any is
#                             (ctest format.check)
#
# Lines stay within 120 columns except where the language does not let them break: an #error or #include line, or a
# string a macro turns into one. Comments starting with "expect-error:" or "header-check:" (read by test/CMakeLists.txt)
# are never reflowed.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
format=${CLANG_FORMAT:-clang-format-19}
command -v "$format" >/dev/null || { echo "format.sh: $format not found (bash cmake/install_deps.sh)" >&2; exit 2; }

files=()
while IFS= read -r f; do files+=("$f"); done < <(
    git ls-files 'include/*.hpp' 'include/*.h' 'test/*.hpp' 'test/*.cpp' 'test/*.cu' 'examples/*.hpp' 'examples/*.cpp' \
                 'examples/*.cu' 'bench/*.hpp' 'bench/*.cpp' 'bench/*.cu' 'fuzz/*.cpp' | grep -v '^test/data/')
[ ${#files[@]} -gt 0 ] || { echo "format.sh: no tracked C++ files (not a git checkout?)" >&2; exit 2; }

if [ "${1:-}" = "--check" ]; then
    bad=0
    for f in "${files[@]}"; do
        if ! "$format" --style=file "$f" | cmp -s - "$f"; then
            echo "not formatted: $f (tools/format.sh formats it)"
            bad=1
        fi
    done
    [ $bad = 0 ] && echo "format.sh: ${#files[@]} files formatted as .clang-format says"
    exit $bad
fi
"$format" --style=file -i "${files[@]}"
echo "format.sh: formatted ${#files[@]} files"

#!/usr/bin/env bash
# Formats the project's Java sources with google-java-format (pinned, from
# Maven Central), or with --check lists the files it would change and fails.
# Usage: scripts/java-format.sh [--check]
set -euo pipefail
cd "$(dirname "$0")/.."

version=1.28.0
# Copied out of Maven's local repository (wherever Maven keeps it) into the
# build directory, once.
tools=java/target/tools
jar="$tools/google-java-format-$version-all-deps.jar"
if [[ ! -f $jar ]]; then
    mvn -B -ntp -q -Dstyle.color=never org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy \
        -Dartifact="com.google.googlejavaformat:google-java-format:$version:jar:all-deps" \
        -DoutputDirectory="$tools"
fi
mapfile -t files < <(git ls-files --cached --others --exclude-standard 'java/*.java' 'scripts/*.java')
# The formatter uses javac's parser, which Java 17 keeps unexported.
opens=()
for p in api code file parser tree util; do
    opens+=("--add-exports=jdk.compiler/com.sun.tools.javac.$p=ALL-UNNAMED")
done
if [[ ${1:-} == --check ]]; then
    changed=$(java "${opens[@]}" -jar "$jar" --dry-run "${files[@]}")
    if [[ -n $changed ]]; then
        echo "not formatted (run scripts/java-format.sh):" >&2
        echo "$changed" >&2
        exit 1
    fi
else
    java "${opens[@]}" -jar "$jar" --replace "${files[@]}"
fi

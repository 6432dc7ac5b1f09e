#!/usr/bin/env bash
# Build the ingero Debian package from a staged tree with dpkg-deb.
#   packaging/build-deb.sh [OUTDIR]          (default build/; prints the .deb path)
# The package carries a ready venv in /opt/ingero/venv, built from the wheelhouse
# (packaging/build-wheelhouse.sh) with Debian's python3.11, so it installs offline and its
# dependencies are exactly the wheels that were tested. The venv is created at its final
# path inside a private mount namespace, so scripts' #! lines are right and the build host's
# /opt is never touched. Needs root, or unprivileged user namespaces.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
out=$(realpath -m "${1:-build}")
py=/usr/bin/python3.11
wheelhouse=$out/wheelhouse
wheel=$(packaging/build-wheelhouse.sh "$wheelhouse" | tail -1)
version=$(basename "$wheel" | cut -d- -f2)
arch=$(dpkg --print-architecture)
stage=$out/deb/ingero_${version}_${arch}
rm -rf "$stage"
mkdir -p "$stage/opt/ingero" "$stage/DEBIAN"

# The changelog's newest entry must be this version; its date dates the man pages, so a
# rebuild of one version gives the same pages.
changelog=packaging/debian/changelog
top=$(sed -n '1s/^ingero (\([^)]*\)).*/\1/p' "$changelog")
[[ $top == "$version" ]] || {
  echo "build-deb: $changelog starts with version '$top', not $version: add an entry" >&2
  exit 1
}
date=$(date -u -d "$(sed -n 's/^ -- .*>  //p' "$changelog" | head -1)" +%F)

# The venv, at /opt/ingero/venv as seen from inside a private mount namespace. No bytecode is
# built or shipped (postinst compiles it on the host); the venv's ingero also writes the man
# pages, the shell completion scripts and the copyright file, so they match what is shipped.
ns=(unshare --mount --propagation private)
[[ $(id -u) == 0 ]] || ns=(unshare --map-root-user --mount --propagation private)
PYTHONDONTWRITEBYTECODE=1 "${ns[@]}" bash -euc '
  stage=$1 py=$2 wheelhouse=$3 date=$4
  mount -t tmpfs ingero-build /opt
  mkdir /opt/ingero
  mount --bind "$stage/opt/ingero" /opt/ingero
  "$py" -m venv /opt/ingero/venv
  /opt/ingero/venv/bin/pip install --quiet --disable-pip-version-check --no-index --no-compile \
    --find-links "$wheelhouse" ingero
  find /opt/ingero/venv -name __pycache__ -type d -prune -exec rm -rf {} +
  /opt/ingero/venv/bin/python packaging/manpages.py "$stage/usr/share/man/man1" "$date"
  install -d "$stage/usr/share/bash-completion/completions" "$stage/usr/share/zsh/vendor-completions"
  _INGERO_COMPLETE=bash_source /opt/ingero/venv/bin/ingero \
    > "$stage/usr/share/bash-completion/completions/ingero"
  _INGERO_COMPLETE=zsh_source /opt/ingero/venv/bin/ingero \
    > "$stage/usr/share/zsh/vendor-completions/_ingero"
  install -d "$stage/usr/share/doc/ingero"
  /opt/ingero/venv/bin/python packaging/copyright.py > "$stage/usr/share/doc/ingero/copyright"
  find /opt/ingero/venv -name __pycache__ -type d -prune -exec rm -rf {} +
' _ "$stage" "$py" "$wheelhouse" "$date"
gzip -9n "$stage"/usr/share/man/man1/*.1
# shared libraries need no execute bit (some wheels set it)
find "$stage/opt/ingero/venv" -type f -name '*.so*' -exec chmod a-x {} +
# the newest glibc symbol version any shipped binary needs
glibc=$(find "$stage/opt/ingero/venv" -type f -name '*.so*' -exec objdump -T {} + 2>/dev/null |
  grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -1)

install -d "$stage/usr/bin"
ln -s /opt/ingero/venv/bin/ingero "$stage/usr/bin/ingero"
install -D -m 644 -t "$stage/lib/systemd/system" systemd/*.service
install -D -m 644 systemd/tmpfiles.d/ingero.conf "$stage/usr/lib/tmpfiles.d/ingero.conf"
install -D -m 644 systemd/sysusers.d/ingero.conf "$stage/usr/lib/sysusers.d/ingero.conf"
# journalctl -x explanations of every MESSAGE_ID ingero writes (postinst updates the index)
install -D -m 644 systemd/catalog/ingero.catalog "$stage/usr/lib/systemd/catalog/ingero.catalog"
install -D -m 755 -t "$stage/usr/lib/ingero/slurm" slurm/prolog slurm/epilog slurm/taskprolog slurm/ingero-hook
install -D -m 644 -t "$stage/usr/share/ingero/slurm" slurm/slurm.conf.snippet slurm/ingero-slurm.env.example
install -D -m 644 -t "$stage/usr/share/ingero/bpf" bpf/*.c
install -D -m 644 -t "$stage/usr/share/ingero/prometheus" contrib/prometheus/*.yml
install -D -m 644 -t "$stage/usr/share/ingero/prometheus/tests" contrib/prometheus/tests/*.yml
install -D -m 644 -t "$stage/usr/share/ingero/grafana" contrib/grafana/ingero.json
# NHC sites link it into /etc/nhc/scripts (docs/slurm.md); NHC then owns the drains
install -D -m 644 -t "$stage/usr/share/ingero/nhc" contrib/nhc/ingero.nhc
doc=$stage/usr/share/doc/ingero
install -D -m 644 -t "$doc" packaging/README.md
gzip -9n < "$changelog" > "$doc/changelog.gz"
chmod 644 "$doc/changelog.gz" "$doc/copyright"
install -D -m 644 packaging/debian/lintian-overrides "$stage/usr/share/lintian/overrides/ingero"
for f in docs/operations.md docs/install.md; do [[ -f $f ]] && install -m 644 "$f" "$doc/"; done
for d in systemd/examples/*.service.d; do
  install -D -m 644 -t "$doc/examples/$(basename "$d")" "$d"/*.conf
done
# configuration files: every key optional, the defaults documented in each daemon's docs
install -d "$stage/etc/ingero"
for daemon in fleet echo fleet-push; do
  printf '# ingero %s configuration; every key is optional (see the docs for the defaults).\n{}\n' \
    "$daemon" > "$stage/etc/ingero/$daemon.yaml"
  chmod 644 "$stage/etc/ingero/$daemon.yaml"
  echo "/etc/ingero/$daemon.yaml" >> "$stage/DEBIAN/conffiles"
done

sed -e "s/@VERSION@/$version/" -e "s/@ARCH@/$arch/" -e "s/@GLIBC@/$glibc/" \
  packaging/debian/control.in > "$stage/DEBIAN/control"
echo "Installed-Size: $(du -sk --exclude=DEBIAN "$stage" | cut -f1)" >> "$stage/DEBIAN/control"
install -m 755 packaging/debian/postinst packaging/debian/prerm packaging/debian/postrm "$stage/DEBIAN/"

deb=$out/ingero_${version}_${arch}.deb
dpkg-deb --root-owner-group -Zxz -z1 --build "$stage" "$deb" >/dev/null
echo "$deb"

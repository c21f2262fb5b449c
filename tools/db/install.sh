#!/usr/bin/env bash
# Installs the database servers the tests start (src/testenv/db): PostgreSQL
# and MariaDB from Debian's packages. Quick and quiet when both are there.
set -euo pipefail

have_postgres() { compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || command -v initdb >/dev/null; }
have_mariadb() {
  { command -v mariadbd || [ -x /usr/sbin/mariadbd ]; } >/dev/null &&
    { command -v mariadb-install-db || [ -x /usr/bin/mariadb-install-db ]; } >/dev/null
}

missing=()
have_postgres || missing+=(postgresql)
have_mariadb || missing+=(mariadb-server)
[ ${#missing[@]} -eq 0 ] && exit 0

echo "db: installing ${missing[*]} (Debian packages) for the tests" >&2
sudo=()
[ "$(id -u)" -eq 0 ] || sudo=(sudo)
command -v apt-get >/dev/null || { echo "db: no apt-get; install ${missing[*]} yourself" >&2; exit 1; }
"${sudo[@]}" apt-get update -q >&2
DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}" >&2

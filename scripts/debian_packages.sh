# Sourced by scripts/install.sh: the one place that installs
# Debian packages. Only apt-get needs root: as root it runs directly, otherwise through
# sudo (without a password when a sudo rule allows apt-get, else asking for it when there
# is a terminal). When neither works, or the machine has no apt-get, it stops with a
# message naming the packages to install and why, and changes nothing.

# missing_debian_packages [--for-tests]: the Debian packages scripts/install.sh needs and this
# machine lacks, space-separated: a JDK (Spark, and javac for the project's jar) for everyone;
# with --for-tests also Chromium (the UI's browser test) and PostgreSQL (the many-MV test).
# INITDB_GLOB: where a PostgreSQL server's initdb is looked for (Debian's layout by default).
missing_debian_packages() {
  local missing=()
  { command -v java && command -v javac && command -v jar; } >/dev/null 2>&1 || missing+=(openjdk-17-jdk-headless procps)
  if [ "${1:-}" = --for-tests ]; then
    command -v chromium >/dev/null 2>&1 || missing+=(chromium)
    compgen -G "${INITDB_GLOB:-/usr/lib/postgresql/*/bin/initdb}" >/dev/null || missing+=(postgresql)
  fi
  echo "${missing[*]}"
}

# install_debian_packages WHAT PACKAGE...
#   WHAT: what the packages are for, in a few words ("Java 17 for Spark").
install_debian_packages() {
  local what=$1
  shift
  local as_root
  if ! command -v apt-get >/dev/null 2>&1; then
    debian_packages_missing "$what" "this machine has no apt-get" "$@"
    return 1
  fi
  if [ "$(id -u)" -eq 0 ]; then
    as_root=root
  elif ! command -v sudo >/dev/null 2>&1; then
    debian_packages_missing "$what" "installing them needs root, and sudo is not installed" "$@"
    return 1
  elif sudo -n -l apt-get >/dev/null 2>&1; then
    as_root="sudo -n"  # a sudo rule lets this user run apt-get without a password
  elif [ -t 0 ]; then
    as_root=sudo  # sudo asks for the password
  else
    debian_packages_missing "$what" \
      "installing them needs root, and sudo does not let this user run apt-get without a password" "$@"
    return 1
  fi
  echo "== installing $* (${what}) with apt-get as ${as_root}"
  if ! debian_apt_get "$as_root" update -qq || ! debian_apt_get "$as_root" install -y -qq "$@" >/dev/null; then
    debian_packages_missing "$what" "apt-get failed (above)" "$@"
    return 1
  fi
}

# debian_apt_get AS_ROOT ARGUMENT...: apt-get without questions, as root, with `sudo -n` or
# with `sudo`. A sudo rule limited to apt-get needs SETENV for DEBIAN_FRONTEND (a rule for
# ALL commands implies it).
debian_apt_get() {
  local as_root=$1
  shift
  case $as_root in
    root) DEBIAN_FRONTEND=noninteractive apt-get "$@" ;;
    "sudo -n") sudo -n DEBIAN_FRONTEND=noninteractive apt-get "$@" ;;
    *) sudo DEBIAN_FRONTEND=noninteractive apt-get "$@" ;;
  esac
}

# debian_packages_missing WHAT WHY PACKAGE...
debian_packages_missing() {
  local what=$1 why=$2
  shift 2
  {
    echo "== cannot install the Debian packages $* (${what}): ${why}."
    echo "   Install them as root, e.g.  sudo apt-get install $*"
    echo "   (or your system's packages that provide them), then run this script again."
  } >&2
}

/* Preloaded by scripts/sanitize.sh into every test process (built without sanitizers, so that it adds no ASan
 * runtime to mpirun or cmake): dlclose() does nothing. Open MPI unloads its components in MPI_Finalize and hwloc its
 * plugins with the last topology; LeakSanitizer, which runs at exit, then no longer sees those libraries' globals
 * (what they allocated looks unreachable) nor their names (every frame reads "<unknown module>", so lsan.supp can not
 * match them). Keeping them mapped makes the reports true and attributable. */
int dlclose(void* handle) {
  (void)handle;
  return 0;
}

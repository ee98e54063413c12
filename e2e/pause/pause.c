/* The pod sandbox process: holds the pod's namespaces open, reaps zombies,
 * exits on SIGINT/SIGTERM. Same contract as upstream's build/pause/linux/pause.c,
 * written here so that the sandbox image is built locally with gcc -static. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_term(int sig) {
  (void)sig;
  _exit(0);
}

static void on_child(int sig) {
  (void)sig;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "-v") == 0) {
    printf("pause (kiln e2e)\n");
    return 0;
  }
  if (getpid() != 1)
    fprintf(stderr, "warning: pause should be the first process\n");

  struct sigaction term = {.sa_handler = on_term};
  struct sigaction child = {.sa_handler = on_child, .sa_flags = SA_NOCLDSTOP};
  if (sigaction(SIGINT, &term, NULL) < 0 || sigaction(SIGTERM, &term, NULL) < 0 ||
      sigaction(SIGCHLD, &child, NULL) < 0)
    return 1;

  for (;;)
    pause();
}

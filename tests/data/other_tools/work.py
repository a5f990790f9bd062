import threading, time


def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)


def spin(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        fib(12)


def main():
    t = threading.Thread(target=spin, args=(0.15,), name="worker")
    t.start()
    spin(0.15)
    t.join()


main()

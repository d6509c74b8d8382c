CREATE TABLE airports (
  code TEXT PRIMARY KEY,
  city TEXT,
  country TEXT
);
CREATE TABLE flights (
  id INTEGER PRIMARY KEY,
  number TEXT,
  origin TEXT REFERENCES airports(code),
  destination TEXT REFERENCES airports(code),
  departure_date TEXT,
  duration_min INTEGER,
  price INTEGER,
  aircraft TEXT
);
CREATE TABLE passengers (
  id INTEGER PRIMARY KEY,
  name TEXT,
  nationality TEXT
);
CREATE TABLE bookings (
  id INTEGER PRIMARY KEY,
  flight_id INTEGER REFERENCES flights(id),
  passenger_id INTEGER REFERENCES passengers(id),
  seat_class TEXT
);
INSERT INTO airports (code, city, country) VALUES ('LIS', 'Lisbon', 'Portugal');
INSERT INTO airports (code, city, country) VALUES ('OSL', 'Oslo', 'Norway');
INSERT INTO airports (code, city, country) VALUES ('LYS', 'Lyon', 'France');
INSERT INTO airports (code, city, country) VALUES ('OPO', 'Porto', 'Portugal');
INSERT INTO airports (code, city, country) VALUES ('KRK', 'Krakow', 'Poland');
INSERT INTO airports (code, city, country) VALUES ('KIX', 'Osaka', 'Japan');
INSERT INTO airports (code, city, country) VALUES ('DUB', 'Dublin', 'Ireland');
INSERT INTO airports (code, city, country) VALUES ('AUS', 'Austin', 'USA');
INSERT INTO airports (code, city, country) VALUES ('CDG', 'Paris', 'France');
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft) VALUES (1, 'AG101', 'KRK', 'DUB', '2025-08-19', 430, 316, 'A321');
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft) VALUES (2, 'AG102', 'KRK', 'CDG', '2025-08-04', 232, 607, 'E190');
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft) VALUES (3, 'AG103', 'LYS', 'OPO', '2025-05-06', 62, 104, 'B787');
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft) VALUES (4, 'AG104', 'KRK', 'OPO', '2025-11-03', 511, 578, 'A321');
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft) VALUES (5, 'AG105', 'CDG', 'KRK', '2025-04-25', 563, 262, 'A320');
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft) VALUES (6, 'AG106', 'OSL', 'KIX', '2025-03-24', 358, 687, 'B787');
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft) VALUES (7, 'AG107', 'DUB', 'LYS', '2025-04-06', 659, 161, 'B787');
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft) VALUES (8, 'AG108', 'OPO', 'CDG', '2025-12-14', 631, 473, 'A321');
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft) VALUES (9, 'AG109', 'KIX', 'OSL', '2025-06-03', 561, 631, 'A321');
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft) VALUES (10, 'AG110', 'LYS', 'AUS', '2025-05-01', 340, 441, 'B737');
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft) VALUES (11, 'AG111', 'LIS', 'CDG', '2025-06-20', 189, 863, 'B787');
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft) VALUES (12, 'AG112', 'DUB', 'OPO', '2025-03-21', 506, 314, 'B737');
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft) VALUES (13, 'AG113', 'OPO', 'KIX', '2025-06-05', 183, 522, 'A320');
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft) VALUES (14, 'AG114', 'DUB', 'OSL', '2025-07-21', 158, 451, 'A321');
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft) VALUES (15, 'AG115', 'CDG', 'AUS', '2025-11-04', 52, 321, 'E190');
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft) VALUES (16, 'AG116', 'CDG', 'OSL', '2025-11-10', 133, 418, 'B737');
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft) VALUES (17, 'AG117', 'KIX', 'CDG', '2025-12-01', 90, 145, 'B737');
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft) VALUES (18, 'AG118', 'KRK', 'OSL', '2025-02-16', 343, 248, 'A321');
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft) VALUES (19, 'AG119', 'CDG', 'LIS', '2025-09-21', 92, 588, 'E190');
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft) VALUES (20, 'AG120', 'OPO', 'CDG', '2025-07-28', 337, 318, 'A320');
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft) VALUES (21, 'AG121', 'OPO', 'AUS', '2025-06-08', 176, 321, 'B737');
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft) VALUES (22, 'AG122', 'KRK', 'OSL', '2025-09-12', 416, 896, 'B737');
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft) VALUES (23, 'AG123', 'LYS', 'OSL', '2025-05-28', 491, 460, 'A320');
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft) VALUES (24, 'AG124', 'AUS', 'LYS', '2025-02-11', 317, 841, 'B787');
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft) VALUES (25, 'AG125', 'DUB', 'OSL', '2025-07-14', 621, 369, 'B737');
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft) VALUES (26, 'AG126', 'AUS', 'DUB', '2025-06-05', 81, 585, 'A320');
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft) VALUES (27, 'AG127', 'OPO', 'OSL', '2025-07-16', 707, 84, 'A320');
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft) VALUES (28, 'AG128', 'OPO', 'CDG', '2025-05-06', 132, 383, 'B787');
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft) VALUES (29, 'AG129', 'OPO', 'KIX', '2025-05-20', 107, 309, 'E190');
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft) VALUES (30, 'AG130', 'AUS', 'LYS', '2025-10-15', 453, 159, 'E190');
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft) VALUES (31, 'AG131', 'OSL', 'LYS', '2025-05-16', 139, 66, 'B787');
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft) VALUES (32, 'AG132', 'OPO', 'LIS', '2025-07-24', 66, 512, 'E190');
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft) VALUES (33, 'AG133', 'DUB', 'OSL', '2025-11-28', 206, 734, 'B737');
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft) VALUES (34, 'AG134', 'OSL', 'CDG', '2025-05-21', 462, 148, 'B787');
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft) VALUES (35, 'AG135', 'LYS', 'KRK', '2025-03-04', 522, 66, 'A320');
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft) VALUES (36, 'AG136', 'AUS', 'KRK', '2025-04-09', 82, 874, 'A321');
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft) VALUES (37, 'AG137', 'OSL', 'CDG', '2025-01-16', 638, 596, 'A320');
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft) VALUES (38, 'AG138', 'LIS', 'DUB', '2025-05-23', 439, 281, 'B737');
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft) VALUES (39, 'AG139', 'KIX', 'OSL', '2025-10-18', 652, 316, 'B787');
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft) VALUES (40, 'AG140', 'LYS', 'DUB', '2025-09-16', 487, 813, 'A320');
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft) VALUES (41, 'AG141', 'LYS', 'CDG', '2025-02-09', 621, 317, 'A321');
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft) VALUES (42, 'AG142', 'AUS', 'CDG', '2025-09-06', 118, 605, 'E190');
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft) VALUES (43, 'AG143', 'LYS', 'CDG', '2025-07-03', 596, 514, 'A320');
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft) VALUES (44, 'AG144', 'OPO', 'OSL', '2025-09-18', 259, 336, 'E190');
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft) VALUES (45, 'AG145', 'CDG', 'OPO', '2025-11-19', 684, 537, 'A320');
INSERT INTO passengers (id, name, nationality) VALUES (1, 'Vera Kowalski', 'Norway');
INSERT INTO passengers (id, name, nationality) VALUES (2, 'Yara Okafor', 'Portugal');
INSERT INTO passengers (id, name, nationality) VALUES (3, 'Wei Moreau', 'Norway');
INSERT INTO passengers (id, name, nationality) VALUES (4, 'Yara Patel', 'Japan');
INSERT INTO passengers (id, name, nationality) VALUES (5, 'Quinn Smith', 'Japan');
INSERT INTO passengers (id, name, nationality) VALUES (6, 'Rosa Okafor', 'USA');
INSERT INTO passengers (id, name, nationality) VALUES (7, 'Rosa Chen', 'USA');
INSERT INTO passengers (id, name, nationality) VALUES (8, 'Elena Smith', 'USA');
INSERT INTO passengers (id, name, nationality) VALUES (9, 'Liam Tanaka', 'Portugal');
INSERT INTO passengers (id, name, nationality) VALUES (10, 'Rosa Ivanova', 'France');
INSERT INTO passengers (id, name, nationality) VALUES (11, 'Ben Tanaka', 'Portugal');
INSERT INTO passengers (id, name, nationality) VALUES (12, 'Priya Kowalski', 'Norway');
INSERT INTO passengers (id, name, nationality) VALUES (13, 'Maya Ivanova', 'Norway');
INSERT INTO passengers (id, name, nationality) VALUES (14, 'Elena Kowalski', 'USA');
INSERT INTO passengers (id, name, nationality) VALUES (15, 'David Larsen', 'France');
INSERT INTO passengers (id, name, nationality) VALUES (16, 'Hiro Smith', 'Portugal');
INSERT INTO passengers (id, name, nationality) VALUES (17, 'Zoe Tanaka', 'Portugal');
INSERT INTO passengers (id, name, nationality) VALUES (18, 'Zoe Ivanova', 'Japan');
INSERT INTO passengers (id, name, nationality) VALUES (19, 'Zoe Novak', 'USA');
INSERT INTO passengers (id, name, nationality) VALUES (20, 'Ines Chen', 'Norway');
INSERT INTO passengers (id, name, nationality) VALUES (21, 'Wei Smith', 'Japan');
INSERT INTO passengers (id, name, nationality) VALUES (22, 'Nora Rossi', 'France');
INSERT INTO passengers (id, name, nationality) VALUES (23, 'Umar Kowalski', 'Norway');
INSERT INTO passengers (id, name, nationality) VALUES (24, 'Elena Okafor', 'Japan');
INSERT INTO passengers (id, name, nationality) VALUES (25, 'Zoe Dubois', 'USA');
INSERT INTO passengers (id, name, nationality) VALUES (26, 'Hiro Larsen', 'USA');
INSERT INTO passengers (id, name, nationality) VALUES (27, 'Hiro Dubois', 'Japan');
INSERT INTO passengers (id, name, nationality) VALUES (28, 'Farid Muller', 'Portugal');
INSERT INTO passengers (id, name, nationality) VALUES (29, 'Maya Haddad', 'Portugal');
INSERT INTO passengers (id, name, nationality) VALUES (30, 'Umar Rossi', 'Japan');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (1, 18, 13, 'business');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (2, 2, 10, 'business');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (3, 24, 13, 'business');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (4, 10, 15, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (5, 18, 29, 'first');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (6, 23, 26, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (7, 6, 9, 'first');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (8, 41, 16, 'business');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (9, 37, 11, 'business');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (10, 7, 17, 'business');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (11, 7, 5, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (12, 30, 11, 'business');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (13, 31, 30, 'business');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (14, 32, 5, 'first');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (15, 2, 6, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (16, 43, 17, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (17, 28, 11, 'first');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (18, 37, 25, 'business');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (19, 19, 22, 'first');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (20, 6, 17, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (21, 8, 17, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (22, 45, 26, 'business');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (23, 14, 3, 'business');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (24, 31, 18, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (25, 20, 22, 'first');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (26, 12, 22, 'business');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (27, 3, 14, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (28, 5, 11, 'business');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (29, 14, 26, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (30, 36, 30, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (31, 43, 26, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (32, 34, 12, 'first');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (33, 4, 29, 'business');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (34, 18, 5, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (35, 13, 18, 'business');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (36, 8, 22, 'business');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (37, 18, 4, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (38, 2, 29, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (39, 10, 7, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (40, 38, 8, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (41, 10, 5, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (42, 43, 19, 'first');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (43, 6, 5, 'first');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (44, 16, 5, 'business');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (45, 23, 3, 'business');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (46, 24, 27, 'first');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (47, 45, 17, 'business');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (48, 17, 17, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (49, 23, 11, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (50, 25, 30, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (51, 33, 26, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (52, 10, 10, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (53, 31, 24, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (54, 25, 8, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (55, 40, 15, 'first');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (56, 28, 6, 'business');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (57, 10, 24, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (58, 32, 3, 'first');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (59, 42, 29, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (60, 24, 3, 'first');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (61, 14, 30, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (62, 41, 14, 'first');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (63, 39, 6, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (64, 30, 21, 'business');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (65, 22, 30, 'first');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (66, 1, 11, 'business');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (67, 8, 18, 'business');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (68, 39, 17, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (69, 24, 7, 'business');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (70, 6, 3, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (71, 32, 6, 'business');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (72, 26, 29, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (73, 20, 25, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (74, 44, 26, 'first');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (75, 31, 6, 'first');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (76, 25, 28, 'business');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (77, 25, 2, 'business');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (78, 33, 11, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (79, 4, 25, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (80, 31, 23, 'first');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (81, 36, 17, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (82, 39, 20, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (83, 27, 23, 'business');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (84, 45, 7, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (85, 9, 23, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (86, 1, 22, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (87, 32, 1, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (88, 41, 25, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (89, 24, 20, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (90, 3, 3, 'first');
